package nftlib

import (
	"fmt"

	"github.com/google/nftables/expr"
)

// VerdictKind is what a verdict does.
type VerdictKind uint8

// The verdicts our rules use.
const (
	Accept VerdictKind = iota
	Drop
	Return
	Jump
	Goto
)

// Verdict ends a rule (jump/goto CHAIN, return, accept, drop).
type Verdict struct {
	Kind  VerdictKind
	Chain string
}

// JumpTo and GotoChain are shorthands for the common verdicts.
func JumpTo(chain string) Verdict    { return Verdict{Kind: Jump, Chain: chain} }
func GotoChain(chain string) Verdict { return Verdict{Kind: Goto, Chain: chain} }

func (v Verdict) text(Family) string {
	switch v.Kind {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Return:
		return "return"
	case Jump:
		return "jump " + v.Chain
	}
	return "goto " + v.Chain
}

// kernelKind is the kernel's code for the verdict (NF_DROP, 0, for a kind
// we do not know).
func (v Verdict) kernelKind() expr.VerdictKind {
	switch v.Kind {
	case Accept:
		return expr.VerdictAccept
	case Return:
		return expr.VerdictReturn
	case Jump:
		return expr.VerdictJump
	case Goto:
		return expr.VerdictGoto
	}
	return expr.VerdictDrop
}

func (v Verdict) expr() *expr.Verdict {
	return &expr.Verdict{Kind: v.kernelKind(), Chain: v.Chain}
}

func (v Verdict) exprs(Family) []expr.Any { return []expr.Any{v.expr()} }

func (v Verdict) direct(b *batch, _ Family) bool {
	b.verdict(v.kernelKind(), v.Chain)
	return true
}

func (Verdict) decode(_ Family, ex []expr.Any) (Term, int, error) {
	e, ok := exprAt[*expr.Verdict](ex, 0)
	if !ok {
		return nil, 0, nil
	}
	v, err := decodeVerdict(e)
	if err != nil {
		return nil, 0, err
	}
	return v, 1, nil
}

func decodeVerdict(v *expr.Verdict) (Verdict, error) {
	switch v.Kind {
	case expr.VerdictAccept:
		return Verdict{Kind: Accept}, nil
	case expr.VerdictDrop:
		return Verdict{Kind: Drop}, nil
	case expr.VerdictReturn:
		return Verdict{Kind: Return}, nil
	case expr.VerdictJump:
		return JumpTo(v.Chain), nil
	case expr.VerdictGoto:
		return GotoChain(v.Chain), nil
	}
	return Verdict{}, fmt.Errorf("verdict %d is not one we write", v.Kind)
}

func (v Verdict) eval(s *state, t *Table, depth int) []result { return s.verdict(t, v, depth) }
