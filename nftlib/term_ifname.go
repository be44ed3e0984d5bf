package nftlib

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// IfName is `iifname "NAME"`, or with Prefix `iifname "NAME*"` (any
// interface whose name starts with NAME); Negate makes it `!=`.
type IfName struct {
	Name   string
	Prefix bool
	Negate bool
}

func (m IfName) text(Family) string {
	op, name := "", m.Name
	if m.Negate {
		op = "!= "
	}
	if m.Prefix {
		name += "*"
	}
	return fmt.Sprintf("iifname %s%s", op, strconv.Quote(name))
}

func (m IfName) exprs(Family) []expr.Any {
	data := []byte(m.Name)
	if !m.Prefix {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, m.Name)
	}
	op := expr.CmpOpEq
	if m.Negate {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

// decode: a whole name is compared padded to IFNAMSIZ, a prefix as it is.
func (IfName) decode(_ Family, ex []expr.Any) (Term, int, error) {
	m, ok := exprAt[*expr.Meta](ex, 0)
	if !ok || m.Key != expr.MetaKeyIIFNAME || m.SourceRegister {
		return nil, 0, nil
	}
	c, ok := cmpAt(ex, 1, expr.CmpOpEq, expr.CmpOpNeq)
	if !ok || len(c.Data) > unix.IFNAMSIZ {
		return nil, 0, nil
	}
	name := strings.TrimRight(string(c.Data), "\x00")
	return IfName{Name: name, Prefix: len(c.Data) < unix.IFNAMSIZ, Negate: c.Op == expr.CmpOpNeq}, 2, nil
}

func (m IfName) eval(s *state, _ *Table, _ int) []result {
	iif := s.pkt.Iif
	match := iif == m.Name || (m.Prefix && strings.HasPrefix(iif, m.Name))
	return s.matchIf(match != m.Negate)
}
