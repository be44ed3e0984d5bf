package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A state file written in place can be read, or left, cut short: its
// writer is still at work, or it stopped half-way (a full disk). Cut at a
// document boundary, the file is valid and merely holds fewer objects;
// cut anywhere else, most of the time it still parses (YAML has no
// closing brackets) and the objects after the cut silently go. What such a
// file looks like, and what a complete one written by a tool (kubectl, a
// YAML or JSON library, an editor) does not:
//
//   - it does not end with a newline: the cut fell inside a line (about
//     all but one cut in twenty). Tools end their output with a newline,
//     but a file typed in an editor may lack it, so this sign alone counts
//     only for a file that had a final newline before (the file source
//     holds such a file only then).
//     A JSON document that parses is whole whatever follows it.
//   - its last line is a key waiting for a value ("spec:", "ports:",
//     "annotations:") or a block scalar's header ("key: |"): the cut fell
//     between a line and the block it opens.
//   - its last document has no kind: kubectl sorts keys, so a List (its
//     kind after its items) or an EndpointSlice (after its endpoints) cut
//     anywhere before its kind has none.
//   - its last object lacks a top-level key ("spec", "status") that the
//     file's other objects of its kind (two at least) all have: kubectl
//     prints "status" last, so a Service cut anywhere has none.
//
// A document that does not parse at all (most JSON cut short) is a syntax
// error, kept at the previous contents as before.

// Tail describes the last document with content of a stream, for telling
// a stream cut short (see CutShort).
type Tail struct {
	text     []byte // its text, as split
	json     bool   // it is a JSON document that parses
	kindless bool   // it decodes to an object without kind
	// kind and keys are its kind and top-level keys (YAML only); shapes
	// are those of the documents before it, by kind.
	kind   string
	keys   []string
	shapes map[string]*docShape
}

// docShape is what the documents of one kind have in common.
type docShape struct {
	count int
	keys  []string // the top-level keys all of them have
}

// minShapes is how many other documents of its kind must agree before the
// last one's missing key is taken as a sign of a cut.
const minShapes = 2

// addTo counts the document in shapes.
func (t Tail) addTo(shapes map[string]*docShape) {
	if t.kind == "" || strings.HasSuffix(t.kind, "List") {
		return
	}
	sh := shapes[t.kind]
	if sh == nil {
		shapes[t.kind] = &docShape{count: 1, keys: t.keys}
		return
	}
	sh.count++
	sh.keys = slices.DeleteFunc(sh.keys, func(k string) bool { return !slices.Contains(t.keys, k) })
}

// topKeys reads a JSON object's kind and top-level keys.
func topKeys(js []byte) (kind string, keys []string) {
	var top map[string]json.RawMessage
	if json.Unmarshal(js, &top) != nil {
		return "", nil
	}
	_ = json.Unmarshal(top["kind"], &kind)
	for k := range top {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return kind, keys
}

// missingKey is a top-level key that the other documents of the last one's
// kind all have and it lacks ("" if none), where a cut could have lost it:
// after every common key it has, in kubectl's (sorted) order. An object
// without apiVersion but with spec was written so, not cut.
func (t Tail) missingKey() (key string, others int) {
	sh := t.shapes[t.kind]
	if t.kind == "" || sh == nil || sh.count < minShapes {
		return "", 0
	}
	for _, k := range sh.keys { // sorted
		if !slices.Contains(t.keys, k) {
			if key == "" {
				key = k
			}
		} else if key != "" {
			return "", 0 // a common key after a missing one
		}
	}
	return key, sh.count
}

// missingKindError is an object without kind, skipped.
type missingKindError struct {
	src  string // the document's (or list item's) Source
	what string // the object as typePeek names it
}

func (e *missingKindError) Error() string {
	return e.src + ": " + e.what + ": kind is missing, skipped"
}

// blockHeader is a block scalar's header: "|", ">-", "|2+" ...
var blockHeader = regexp.MustCompile(`^[|>][-+0-9]{0,2}$`)

// opensBlock reports whether line opens a block that must follow it: a
// mapping key with no value ("  ports:", "- metadata:"), or a key whose
// value is a block scalar ("  config: |").
func opensBlock(line []byte) bool {
	s := bytes.TrimSpace(line)
	for bytes.HasPrefix(s, []byte("- ")) {
		s = bytes.TrimSpace(s[2:])
	}
	key, val, ok := bytes.Cut(s, []byte(": "))
	if !ok || !blockHeader.Match(bytes.TrimSpace(val)) {
		key, ok = bytes.CutSuffix(s, []byte(":"))
		if !ok || bytes.Contains(key, []byte(": ")) {
			return false
		}
	}
	if len(key) == 0 {
		return false
	}
	switch key[0] {
	case '#', '{', '[', '"', '\'', '-':
		return false // a comment, a flow collection or a quoted scalar
	}
	return true
}

// CutShort tells whether data, whose last document with content is t,
// looks cut short, and why. strong is false when the only sign is the
// missing final newline, which a complete hand-written file may lack.
func (t Tail) CutShort(data []byte) (reason string, strong bool) {
	if len(t.text) == 0 {
		return "", false // nothing but comments and blank lines
	}
	if t.kindless {
		return "its last document has no kind (a List or EndpointSlice cut before its kind?)", true
	}
	if last := lastContentLine(t.text); !t.json && last != nil && opensBlock(last) {
		return "its last line " + quoteLine(last) + " opens a block that is not there", true
	}
	if key, others := t.missingKey(); key != "" {
		return fmt.Sprintf("its last document, a %s, has no %q, which the %d %ss before it all have", t.kind, key, others, t.kind), true
	}
	if data[len(data)-1] != '\n' && !t.json {
		return "it ends in the middle of a line, without a final newline", false
	}
	return "", false
}

// lastContentLine is the last line of a document that is neither blank nor
// a comment, without its line break and trailing blanks.
func lastContentLine(doc []byte) []byte {
	for len(doc) > 0 {
		i := bytes.LastIndexByte(bytes.TrimRight(doc, "\n"), '\n')
		line := bytes.TrimRight(doc[i+1:], " \t\r\n")
		if !isBlankOrComment(line) {
			return line
		}
		if i < 0 {
			return nil
		}
		doc = doc[:i]
	}
	return nil
}

func quoteLine(line []byte) string {
	s := string(bytes.TrimSpace(line))
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return `"` + s + `"`
}
