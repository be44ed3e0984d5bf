package informers

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// LoadState reads the objects under path (a file, or a directory's *.yaml,
// *.yml and *.json files, not recursively) and builds the state for node
// nodeName. problems lists every bad file, document, object and value,
// then the values Services lost to each other (see ConflictError); what is
// fine still loads. The state is nil only when path itself cannot be read,
// so a caller reloading on change can keep its last good state then.
func LoadState(path, nodeName string) (*proxier.State, []error) {
	b := NewBuilder(nodeName)
	problems, err := LoadInto(b, path)
	if err != nil {
		return nil, append([]error{err}, problems...)
	}
	return b.State(), append(problems, b.conflictErrors()...)
}

// LoadInto reads the objects under path (see LoadState) into b. err is set
// only when path cannot be read at all; problems are per file or object.
func LoadInto(b *Builder, path string) (problems []error, err error) {
	files, err := manifestFiles(path)
	if err != nil {
		return nil, err
	}
	dec, err := NewDecoder()
	if err != nil {
		return nil, err
	}
	seen := map[objectRef]string{} // object -> where it was first defined
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			problems = append(problems, fmt.Errorf("reading manifest: %w", err))
			continue
		}
		objs, errs := dec.Decode(data, f)
		problems = append(problems, errs...)
		for _, o := range objs {
			problems = append(problems, upsertObject(b, o, seen)...)
		}
	}
	return problems, nil
}

// manifestFiles lists what LoadInto reads: path itself if it is a file
// (whatever its name), else the directory's manifests in name order. Hidden
// files are left out: editors keep their swap and backup files there.
func manifestFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading manifests: %w", err)
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("reading manifests: %w", err)
	}
	var files []string
	for _, e := range entries {
		if isManifestName(e.Name()) && !e.IsDir() {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	return files, nil
}

func isManifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// upsertObject feeds one decoded object to b and returns its problems, each
// prefixed with where the object came from.
func upsertObject(b *Builder, o Object, seen map[objectRef]string) []error {
	var ref objectRef
	var err error
	switch obj := o.Obj.(type) {
	case *corev1.Service:
		ref = objectRef{"service", namespaceOrDefault(obj.Namespace), obj.Name}
		err = b.UpsertService(obj)
	case *discoveryv1.EndpointSlice:
		ref = objectRef{"endpointslice", namespaceOrDefault(obj.Namespace), obj.Name}
		err = b.UpsertEndpointSlice(obj)
	case *corev1.Node:
		ref = objectRef{"node", "", obj.Name}
		err = b.UpsertNode(obj)
	default:
		return []error{&Warning{fmt.Errorf("%s: unexpected object type %T, skipped", o.Source, o.Obj)}}
	}
	var out []error
	if first, dup := seen[ref]; dup {
		out = append(out, &Warning{fmt.Errorf("%s: %s %s is also defined at %s; this later one wins",
			o.Source, ref.kind, objectName(ref.namespace, ref.name), first)})
	} else {
		seen[ref] = o.Source
	}
	for _, e := range SplitErrors(err) {
		out = append(out, fmt.Errorf("%s: %w", o.Source, e))
	}
	return out
}
