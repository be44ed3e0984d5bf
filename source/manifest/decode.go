// Package manifest decodes Kubernetes manifests, YAML or JSON streams of
// documents and lists, into the objects the proxy uses (Services,
// EndpointSlices, Nodes, ServiceCIDRs), each with the file and line it came from; a bad
// document or object is reported and skipped alone. It also tells a stream
// that looks cut short (see Tail), for the file source.
package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"
)

// Object is one decoded object the proxy uses, with where it came from.
type Object struct {
	// Source is "file:line" of the YAML document, plus " items[N]" inside a list.
	Source string
	// Obj is a *corev1.Service, *discoveryv1.EndpointSlice, *corev1.Node or
	// *networkingv1.ServiceCIDR.
	Obj runtime.Object
}

// Warning marks a problem that lost nothing the proxy needs: an object of a
// kind it does not use, an unknown field, a repeated object. Test with
// errors.As or IsWarning.
type Warning struct{ Err error }

func (w *Warning) Error() string { return w.Err.Error() }
func (w *Warning) Unwrap() error { return w.Err }

// IsWarning reports whether err is, or wraps, a Warning.
func IsWarning(err error) bool {
	var w *Warning
	return errors.As(err, &w)
}

// Decoder decodes Services, EndpointSlices, Nodes and ServiceCIDRs (and lists of them)
// from YAML or JSON. Build one with NewDecoder; it is safe for concurrent use.
type Decoder struct {
	codec runtime.Decoder
	// Transform, when set, is applied to each object as soon as it is
	// decoded (the file source keeps only what the Builder reads: done
	// per object, a large file's objects are never all held whole). Set
	// it before the first Decode; it must be safe for concurrent use.
	Transform func(runtime.Object) runtime.Object
}

// NewDecoder returns a Decoder that knows core/v1, discovery.k8s.io/v1 and
// networking.k8s.io/v1.
func NewDecoder() (*Decoder, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering core/v1: %w", err)
	}
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering discovery.k8s.io/v1: %w", err)
	}
	if err := networkingv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering networking.k8s.io/v1: %w", err)
	}
	// Strict mode reports unknown and duplicate fields but still returns
	// the object, so they become warnings rather than losses.
	codecs := serializer.NewCodecFactory(scheme, serializer.EnableStrict)
	return &Decoder{codec: codecs.UniversalDeserializer()}, nil
}

// Decode reads every document of a YAML or JSON stream. name prefixes
// every Source and message (usually the file name). Bad documents and
// objects are reported and skipped; the rest is returned.
func (d *Decoder) Decode(data []byte, name string) ([]Object, []error) {
	objs, errs, _ := d.DecodeWithTail(data, name)
	return objs, errs
}

// DecodeWithTail is Decode, also describing the last document with
// content, for telling a stream cut short (see Tail.CutShort).
func (d *Decoder) DecodeWithTail(data []byte, name string) ([]Object, []error, Tail) {
	var objs []Object
	var errs []error
	var tail Tail
	shapes := map[string]*docShape{} // of the documents before the last
	for _, doc := range splitDocuments(data) {
		src := name + ":" + strconv.Itoa(doc.line)
		js, isJSON, err := docToJSON(doc)
		if err != nil {
			var se *SyntaxError
			if errors.As(err, &se) {
				se.File = name
				errs = append(errs, fmt.Errorf("%s: invalid YAML in the document starting here: %w", src, err))
				continue
			}
			errs = append(errs, &Warning{fmt.Errorf("%s: %w", src, err)})
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // only comments or whitespace
		}
		o, e := d.decodeJSON(js, src)
		if d.Transform != nil {
			for i := range o {
				o[i].Obj = d.Transform(o[i].Obj)
			}
		}
		objs, errs = append(objs, o...), append(errs, e...)
		tail.addTo(shapes)
		tail = Tail{text: doc.data, json: isJSON, kindless: slices.ContainsFunc(e, func(err error) bool {
			var m *missingKindError
			return errors.As(err, &m) && m.src == src
		})}
		if !isJSON { // JSON cut short does not parse: no need to look
			tail.kind, tail.keys = topKeys(js)
		}
	}
	tail.shapes = shapes
	return objs, errs, tail
}

// SyntaxError is a document that is not valid YAML (or JSON): nothing in it
// can be read, not even which objects it meant to hold.
type SyntaxError struct {
	File string // as given to Decode
	Line int    // where the document starts
	Err  error  // the parser's message, lines counted from the top of the file
}

func (e *SyntaxError) Error() string { return e.Err.Error() }
func (e *SyntaxError) Unwrap() error { return e.Err }

// docToJSON converts one document to JSON. YAML problems that lose nothing
// (a repeated key) come back with the JSON; a SyntaxError comes alone.
func docToJSON(doc document) (js []byte, isJSON bool, err error) {
	// JSON needs no YAML parser, which is far slower on large files.
	if t := bytes.TrimSpace(doc.data); len(t) > 0 && t[0] == '{' && json.Valid(t) {
		return t, true, nil
	}
	// The document is parsed without the lines before it (padding it would
	// make a file of many documents quadratic), so shift the parser's line
	// numbers to count from the top of the file.
	shift := doc.start - 1
	js, err = yaml.YAMLToJSONStrict(doc.data)
	if err == nil {
		return js, false, nil
	}
	// Retry leniently: a repeated key loses nothing we can't name.
	js, lerr := yaml.YAMLToJSON(doc.data)
	if lerr != nil {
		return nil, false, &SyntaxError{Line: doc.line, Err: shiftLines(lerr, shift)}
	}
	return js, false, shiftLines(err, shift)
}

// yamlLine finds the line numbers in go-yaml's messages: "yaml: line N: ..."
// and, in a list of unmarshal errors, "  line N: ...".
var yamlLine = regexp.MustCompile(`(?m)^(yaml: line |  line )(\d+)`)

// lineShifted is an error whose message has its line numbers shifted.
type lineShifted struct {
	msg string
	err error
}

func (e *lineShifted) Error() string { return e.msg }
func (e *lineShifted) Unwrap() error { return e.err }

func shiftLines(err error, by int) error {
	if by == 0 {
		return err
	}
	msg := yamlLine.ReplaceAllStringFunc(err.Error(), func(m string) string {
		sub := yamlLine.FindStringSubmatch(m)
		n, _ := strconv.Atoi(sub[2])
		return sub[1] + strconv.Itoa(n+by)
	})
	return &lineShifted{msg: msg, err: err}
}

// typePeek reads what is needed to name an object in a message even when
// the object itself does not decode.
type typePeek struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

func (p typePeek) String() string {
	s := p.Kind
	if s == "" {
		s = "object"
	}
	if n := objectName(p.Metadata.Namespace, p.Metadata.Name); n != "" {
		s += " " + n
	}
	return s
}

func (d *Decoder) decodeJSON(js []byte, src string) ([]Object, []error) {
	var peek typePeek
	if err := json.Unmarshal(js, &peek); err != nil {
		return nil, []error{fmt.Errorf("%s: not a Kubernetes object: %w", src, err)}
	}
	obj, _, err := d.codec.Decode(js, nil, nil)
	var errs []error
	switch {
	case err == nil:
	case runtime.IsNotRegisteredError(err):
		return nil, []error{&Warning{fmt.Errorf("%s: %s: kind %q of apiVersion %q is not used by the proxy, skipped", src, peek, peek.Kind, peek.APIVersion)}}
	case runtime.IsMissingKind(err):
		return nil, []error{&missingKindError{src: src, what: peek.String()}}
	case runtime.IsMissingVersion(err):
		return nil, []error{fmt.Errorf("%s: %s: apiVersion is missing, skipped", src, peek)}
	case runtime.IsStrictDecodingError(err) && obj != nil:
		errs = append(errs, &Warning{fmt.Errorf("%s: %s: %w", src, peek, err)})
	case strings.HasSuffix(peek.Kind, "List") && peek.Kind != "List":
		// One bad item fails a typed list as a whole; take the items one
		// by one so only the bad ones are lost.
		if objs, errs, ok := d.decodeItems(js, peek, src); ok {
			return objs, errs
		}
		return nil, []error{fmt.Errorf("%s: %s: %w, skipped", src, peek, err)}
	default:
		return nil, []error{fmt.Errorf("%s: %s: %w, skipped", src, peek, err)}
	}

	switch o := obj.(type) {
	case *corev1.Service, *discoveryv1.EndpointSlice, *corev1.Node, *networkingv1.ServiceCIDR:
		return []Object{{Source: src, Obj: o}}, errs
	case *corev1.List:
		var objs []Object
		for i := range o.Items {
			itemSrc := src + " items[" + strconv.Itoa(i) + "]"
			if len(o.Items[i].Raw) == 0 {
				errs = append(errs, fmt.Errorf("%s: empty list item", itemSrc))
				continue
			}
			io, ie := d.decodeJSON(o.Items[i].Raw, itemSrc)
			objs, errs = append(objs, io...), append(errs, ie...)
		}
		return objs, errs
	case *corev1.ServiceList:
		return listItems(o.Items, src), errs
	case *discoveryv1.EndpointSliceList:
		return listItems(o.Items, src), errs
	case *corev1.NodeList:
		return listItems(o.Items, src), errs
	case *networkingv1.ServiceCIDRList:
		return listItems(o.Items, src), errs
	}
	return nil, append(errs, &Warning{fmt.Errorf("%s: %s: kind %q is not used by the proxy, skipped", src, peek, peek.Kind)})
}

// decodeItems decodes the items of a typed list (ServiceList, ...) one at a
// time, giving each the list's apiVersion and item kind unless it has its
// own. ok is false when js has no items to take apart.
func (d *Decoder) decodeItems(js []byte, peek typePeek, src string) (objs []Object, errs []error, ok bool) {
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if json.Unmarshal(js, &list) != nil {
		return nil, nil, false
	}
	kind := strings.TrimSuffix(peek.Kind, "List")
	for i, raw := range list.Items {
		itemSrc := src + " items[" + strconv.Itoa(i) + "]"
		var item map[string]json.RawMessage
		if err := json.Unmarshal(raw, &item); err != nil {
			errs = append(errs, fmt.Errorf("%s: not a Kubernetes object: %w", itemSrc, err))
			continue
		}
		if _, has := item["kind"]; !has {
			item["kind"], _ = json.Marshal(kind)
			item["apiVersion"], _ = json.Marshal(peek.APIVersion)
		}
		one, err := json.Marshal(item)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", itemSrc, err))
			continue
		}
		o, e := d.decodeJSON(one, itemSrc)
		objs, errs = append(objs, o...), append(errs, e...)
	}
	return objs, errs, true
}

// listItems unpacks a typed list (ServiceList, ...), whose items carry no kind.
func listItems[T any, PT interface {
	*T
	runtime.Object
}](items []T, src string) []Object {
	objs := make([]Object, 0, len(items))
	for i := range items {
		objs = append(objs, Object{Source: src + " items[" + strconv.Itoa(i) + "]", Obj: PT(&items[i])})
	}
	return objs
}

type document struct {
	data  []byte
	start int // 1-based line where data starts
	line  int // the first line with content, for messages
}

// splitDocuments cuts a YAML stream at "---" lines. JSON has no such lines,
// so a JSON file comes back whole. Each document's data is a part of data,
// not a copy (but for one that a "..." line ends before more lines): a
// large file has millions of lines, and a slice per line and a copy of
// each document cost more memory than the file.
func splitDocuments(data []byte) []document {
	var docs []document
	cur := document{start: 1}
	from := 0         // where cur's data begins in data
	var copied []byte // cur's data once a "..." line was left out of it
	var dropped bool  // cur lost a "..." line: its data is copied
	finish := func(at int) {
		switch {
		case dropped:
			cur.data = copied
		case at > from:
			cur.data = data[from:at:at]
		}
		docs = append(docs, cur)
	}
	for i, off := 0, 0; off < len(data); i++ {
		ln := data[off:]
		if n := bytes.IndexByte(ln, '\n'); n >= 0 {
			ln = ln[:n+1]
		}
		next := off + len(ln)
		trimmed := bytes.TrimRight(ln, " \t\r\n")
		switch {
		case bytes.Equal(trimmed, []byte("---")) || bytes.HasPrefix(trimmed, []byte("--- ")) || bytes.HasPrefix(trimmed, []byte("---\t")):
			finish(off)
			// Whatever follows the marker on its line belongs to the next document.
			cur, from, copied, dropped = document{start: i + 2}, next, nil, false
			if rest := ln[3:]; !isBlankOrComment(rest) {
				cur, from = document{start: i + 1}, off+3
			}
		case bytes.Equal(trimmed, []byte("...")):
			// explicit end of document: nothing to keep
			if !dropped {
				copied, dropped = append([]byte(nil), data[from:off]...), true
			}
		case dropped:
			copied = append(copied, ln...)
		}
		off = next
	}
	finish(len(data))
	for i := range docs {
		docs[i].line = docs[i].start + leadingBlankLines(docs[i].data)
	}
	return docs
}

// leadingBlankLines counts the blank and comment lines a document opens
// with, so messages point at its first real line.
func leadingBlankLines(data []byte) int {
	n := 0
	for len(data) > 0 {
		ln, rest, _ := bytes.Cut(data, []byte("\n"))
		if !isBlankOrComment(ln) || len(rest) == 0 {
			break
		}
		n, data = n+1, rest
	}
	return n
}

func isBlankOrComment(ln []byte) bool {
	t := bytes.TrimSpace(ln)
	return len(t) == 0 || t[0] == '#'
}

// objectName is namespace/name, or name alone for a cluster-scoped object.
func objectName(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}
