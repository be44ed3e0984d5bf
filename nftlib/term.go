package nftlib

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A Term is one piece of a rule: a match, a statement or a verdict. Each
// kind of term lives in its own file (term_<kind>.go) with everything the
// package knows of it: its nft text (exactly as `nft list ruleset` prints
// it), the netlink expressions `nft` itself would emit for that text (and,
// for the terms that fill most of a full sync, a direct encoding: see
// directTerm), how to recognise those expressions in a rule read back from
// the kernel, and what it does to a packet in a Trace. So what we render,
// what the tracer evaluates and what the kernel runs are one object.
//
// Terms are plain comparable values: two rules are equal when their terms
// are, which is how the diff decides what changed. The interface is closed
// (its methods are unexported): every kind is in termKinds, and the
// compiler holds each to all four parts.
type Term interface {
	text(f Family) string
	exprs(f Family) []expr.Any
	// decode recognises the term's expressions at the start of ex (as
	// parseExprs reads them back from the kernel) and returns the term
	// they encode and how many expressions it took; n == 0 (with a nil
	// error) when ex does not start with this kind of term. The receiver
	// is the kind's zero value and is not used.
	decode(f Family, ex []expr.Any) (t Term, n int, err error)
	// eval applies the term to one branch of a Trace.
	eval(s *state, t *Table, depth int) []result
}

// termKinds are the kinds of term, in the order decodeRule tries them: a
// kind whose expressions begin as another's comes first (a SetLookup with
// its protocol starts as a ProtoMatch; a SetMatch is a one-field
// SetLookup without one). It is a constant table: nothing writes it.
var termKinds = [...]Term{
	SetLookup{}, SetMatch{}, vmapLookup{},
	AddrMatch{}, ProtoMatch{}, PortMatch{}, FibLocal{}, CtState{}, CtStateNone{}, CtStatusNone{}, IfName{},
	MarkIsSet{}, MarkZero{}, MarkSet{},
	NumgenZero{}, StickyMatch{}, StickyUpdate{},
	DNAT{}, Masquerade{}, Reject{}, Verdict{},
}

// decodeRule turns a rule's expressions back into the terms that emit them:
// at each position, the first kind of term whose expressions start there.
func decodeRule(f Family, b []byte) ([]Term, error) {
	ex, err := parseExprs(f, b)
	if err != nil {
		return nil, err
	}
	// A counter counts; it matches nothing and no term of ours writes one.
	ex = slices.DeleteFunc(ex, func(e expr.Any) bool { _, ok := e.(*expr.Counter); return ok })
	terms := make([]Term, 0, len(ex)/2)
	for len(ex) > 0 {
		t, n, err := decodeTerm(f, ex)
		if err != nil {
			return nil, err
		}
		terms = append(terms, t)
		ex = ex[n:]
	}
	return terms, nil
}

func decodeTerm(f Family, ex []expr.Any) (Term, int, error) {
	for _, kind := range termKinds {
		t, n, err := kind.decode(f, ex)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", describeExprs(ex), err)
		}
		if n > 0 {
			return t, n, nil
		}
	}
	return nil, 0, fmt.Errorf("%s: not a term we write", describeExprs(ex))
}

// describeExprs names the first few expressions of ex for an error.
func describeExprs(ex []expr.Any) string {
	parts := make([]string, 0, 4)
	for i, e := range ex {
		if i == 4 {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, describeExpr(e))
	}
	return "expressions " + strings.Join(parts, ", ")
}

func describeExpr(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Payload:
		return fmt.Sprintf("payload (base %d offset %d length %d)", e.Base, e.Offset, e.Len)
	case *expr.Meta:
		return fmt.Sprintf("meta (key %d)", e.Key)
	case *expr.Cmp:
		return fmt.Sprintf("cmp (op %d, %d bytes)", e.Op, len(e.Data))
	case *expr.Lookup:
		return "lookup @" + e.SetName
	case *expr.Dynset:
		return "dynset @" + e.SetName
	case *expr.Verdict:
		return fmt.Sprintf("verdict %d", e.Kind)
	}
	return strings.ToLower(strings.TrimPrefix(fmt.Sprintf("%T", e), "*expr."))
}

// exprAt is ex[i] as an expression of type E, if it is one.
func exprAt[E expr.Any](ex []expr.Any, i int) (E, bool) {
	var zero E
	if i >= len(ex) {
		return zero, false
	}
	e, ok := ex[i].(E)
	return e, ok
}

// cmpAt is ex[i] if it is a comparison by one of ops.
func cmpAt(ex []expr.Any, i int, ops ...expr.CmpOp) (*expr.Cmp, bool) {
	c, ok := exprAt[*expr.Cmp](ex, i)
	if !ok || !slices.Contains(ops, c.Op) {
		return nil, false
	}
	return c, true
}

// u32Of reads a 4-byte register value in host order; ok is false for
// another length.
func u32Of(b []byte) (uint32, bool) {
	if len(b) != 4 {
		return 0, false
	}
	return binary.NativeEndian.Uint32(b), true
}

// maskedU32 reads a bitwise that only masks a 32-bit register (xor 0).
func maskedU32(bw *expr.Bitwise) (mask uint32, ok bool) {
	mask, ok = u32Of(bw.Mask)
	xor, xok := u32Of(bw.Xor)
	return mask, ok && xok && xor == 0
}

// ProtoName is nft's name of an L4 protocol number (tcp, udp, sctp).
func ProtoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}

func le32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
