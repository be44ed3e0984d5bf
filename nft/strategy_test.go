package nft

import "testing"

// The zero Strategy is the product's: each size its documented default.
// A size set is kept; FoldAt and LargeTxRound follow the sync when zero.
func TestStrategyDefaults(t *testing.T) {
	tests := []struct {
		name                         string
		s                            Strategy
		stageRules, stagePieces, lrg int
		foldAt1k, foldAt10k          int // the fold limit at 1000 and 10000 service ports
		round                        int // the release round of 1000 rules
	}{
		{"zero: the product's", Strategy{}, defaultStageRules, defaultStagePieces, largeTxRules, 64, 625, 400},
		{"every size set", Strategy{FoldAt: 3, StageRules: 2, StagePieces: 5, LargeTxRules: 7, LargeTxRound: 11}, 2, 5, 7, 3, 3, 11},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s.withDefaults()
			if s.StageRules != tc.stageRules || s.StagePieces != tc.stagePieces || s.LargeTxRules != tc.lrg {
				t.Errorf("stage rules %d, pieces %d, large transaction %d; want %d, %d, %d",
					s.StageRules, s.StagePieces, s.LargeTxRules, tc.stageRules, tc.stagePieces, tc.lrg)
			}
			if a, b := s.foldLimit(1000), s.foldLimit(10000); a != tc.foldAt1k || b != tc.foldAt10k {
				t.Errorf("fold limits %d, %d; want %d, %d", a, b, tc.foldAt1k, tc.foldAt10k)
			}
			if r := s.releaseRound(1000); r != tc.round {
				t.Errorf("release round %d, want %d", r, tc.round)
			}
		})
	}
}
