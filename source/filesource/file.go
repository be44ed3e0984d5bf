package filesource

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// LoadState reads the objects under path (a file, or a directory's *.yaml,
// *.yml and *.json files, not recursively) and builds the state for node
// nodeName, as a FileSource's first load would. problems lists every bad
// file, document, object and value, then the values Services lost to each
// other (see ConflictError); bad objects are skipped and the rest loads.
// The state is nil when path or one of its files cannot be read or parsed
// (a *FileError among the problems): that state would be incomplete. opts
// are the Builder's (see kube.Option).
func LoadState(path, nodeName string, opts ...kube.Option) (*model.State, []error) {
	s, err := newFileSet(path, nodeName, opts...)
	if err != nil {
		return nil, []error{err}
	}
	res := s.reload()
	problems := append(res.failures, res.problems...)
	if len(res.failures) > 0 {
		return nil, problems
	}
	return s.b.State(), append(problems, s.b.ConflictErrors()...)
}

// manifestFiles lists what LoadState reads: path itself if it is a file
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
