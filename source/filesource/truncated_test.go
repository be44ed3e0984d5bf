package filesource

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
	"github.com/kube-nftproxy/kube-nftproxy/source/manifest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// TestFileSourceHoldsFileCutShort: a file rewritten in place that ends
// mid-document keeps its previous contents, with a warning, while it may
// still be written; unchanged past the hold it is a failure (still keeping
// them); complete, it is read.
func TestFileSourceHoldsFileCutShort(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.yaml")
	full := svcYAML("a", "10.96.0.1") + svcYAML("b", "10.96.0.2")
	write(t, path, full)
	var log syncBuffer
	r := startSource(t, dir, logTo(&log), func(s *FileSource) { s.watch.writeWait = 200 * time.Millisecond })
	r.waitState(t, "default/a:http", "default/b:http")

	// As a writer stopped by a full disk leaves it: cut inside b's spec.
	cut := full[:strings.Index(full, "  clusterIP: 10.96.0.2")+len("  cluster")]
	write(t, path, cut)
	waitLog(t, &log, "level=WARN", path, "in the middle of a line", "still being written")
	err := r.waitError(t, path, "cut short?")
	r.noState(t)
	t.Logf("after the hold: %v", err)

	// Cut at a line that opens a block: the same.
	write(t, path, svcYAML("a", "10.96.0.1")+"---\napiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: default}\nspec:\n")
	r.waitError(t, path, `last line "spec:" opens a block`)
	r.noState(t)

	write(t, path, full+svcYAML("c", "10.96.0.3"))
	r.waitState(t, "default/a:http", "default/b:http", "default/c:http")
	r.wait(t, r.recovered, "recovery")
}

// TestFileSourceLogsRemovedServices: a change that takes Services away
// says how many and which, and from which file.
func TestFileSourceLogsRemovedServices(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.yaml")
	var all string
	var want []string
	for i := range 15 {
		all += svcYAML(fmt.Sprintf("s%02d", i), fmt.Sprintf("10.96.0.%d", i+1))
		want = append(want, fmt.Sprintf("default/s%02d:http", i))
	}
	write(t, path, all)
	write(t, filepath.Join(dir, "t.yaml"), svcYAML("t", "10.96.1.1"))
	var log syncBuffer
	r := startSource(t, dir, logTo(&log))
	r.waitState(t, append(want, "default/t:http")...)

	// Cut at a document boundary: valid, and 12 Services fewer.
	write(t, path, all[:strings.Index(all, svcYAML("s03", "10.96.0.4"))])
	r.waitState(t, append(want[:3:3], "default/t:http")...)
	line := waitLog(t, &log, "Services removed", "count=12")
	for _, s := range []string{"default/s03, default/s04", "default/s12 and 2 more", "files=" + path} {
		if !strings.Contains(line, s) {
			t.Errorf("the log line %q lacks %q", line, s)
		}
	}
}

// kubectlServices are n Services as the API server returns them: several
// types, one or two ports, a load balancer's status.
func kubectlServices(n int) []corev1.Service {
	local := corev1.ServiceExternalTrafficPolicyLocal
	out := make([]corev1.Service, n)
	for i := range out {
		s := corev1.Service{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%03d", i), Namespace: []string{"default", "shop", "kube-system"}[i%3],
				Labels: map[string]string{"app": fmt.Sprintf("app-%d", i)}, UID: types.UID(fmt.Sprintf("2b2c1a0e-0000-4000-8000-00000000%04d", i)),
				ResourceVersion: fmt.Sprint(1000 + i), CreationTimestamp: metav1.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
			Spec: corev1.ServiceSpec{
				ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250), Selector: map[string]string{"app": fmt.Sprintf("app-%d", i)},
				Ports:           []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
				Type:            corev1.ServiceTypeClusterIP,
				SessionAffinity: corev1.ServiceAffinityNone,
			},
		}
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
		switch i % 3 {
		case 1:
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromString("https"), NodePort: int32(31000 + i)})
			s.Spec.Ports[0].NodePort = int32(30000 + i)
		case 2:
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = local
			s.Spec.HealthCheckNodePort = int32(32000 + i)
			s.Spec.Ports[0].NodePort = int32(30000 + i)
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("192.0.2.%d", 1+i%250)}}
		}
		out[i] = s
	}
	return out
}

// stateFormats are n Services as kubectl prints them: one YAML document
// each, a kind: List in YAML, and in JSON.
func stateFormats(t *testing.T, n int) map[string][]byte {
	t.Helper()
	svcs := kubectlServices(n)
	var multi []byte
	for i := range svcs {
		y, err := yaml.Marshal(&svcs[i])
		if err != nil {
			t.Fatal(err)
		}
		multi = append(append(multi, "---\n"...), y...)
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]string{"resourceVersion": ""}, "items": svcs}
	listYAML, err := yaml.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	listJSON, err := json.MarshalIndent(list, "", "    ")
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{"multi-document YAML": multi, "kind: List YAML": listYAML, "kind: List JSON": append(listJSON, '\n')}
}

// truncationOutcome counts what became of a state file cut at each offset.
type truncationOutcome struct {
	offsets, held, failed, logged, warned, same, altered int
}

// TestTruncatedStateFile cuts state files of Services written as kubectl
// prints them, and checks that no cut takes a Service away silently: the
// file is held as still being written, or fails to parse, or the Services
// it lost are logged as removed or reported as bad. A cut inside one
// document behaves as a cut at the same place of any other, so every byte
// of the documents of three Services (one of each type) is cut in a file
// of 7, and a file of 300 is cut at random offsets (-truncation-random;
// a decode of it takes about 0.1 s). It prints the fraction caught.
func TestTruncatedStateFile(t *testing.T) {
	small, large := stateFormats(t, 7), stateFormats(t, 300)
	for format := range small {
		t.Run(format, func(t *testing.T) {
			var o truncationOutcome
			full := small[format]
			o.sweep(t, full, everyOffsetOfThree(full))
			rng := rand.New(rand.NewPCG(7, 7))
			var random []int
			for range *truncationRandom {
				random = append(random, 1+rng.IntN(len(large[format])-1))
			}
			o.sweep(t, large[format], random)
			t.Logf("%s: cut at %d offsets: held as cut short %d (%.1f%%), syntax error %d (%.1f%%), removal logged %d, a bad object reported %d, same Services %d, altered without a word %d; caught (held or refused) %.1f%%",
				format, o.offsets, o.held, pct(o.held, o.offsets), o.failed, pct(o.failed, o.offsets), o.logged, o.warned, o.same, o.altered, pct(o.held+o.failed, o.offsets))
		})
	}
}

// sweep loads full, then each cut of it followed by full again.
func (o *truncationOutcome) sweep(t *testing.T, full []byte, offsets []int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.yaml")
	set, err := newFileSet(path, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	set.holdFor = time.Hour
	load := func(data []byte) reloadResult {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return set.reload()
	}
	if res := load(full); !res.complete || len(res.problems) > 0 {
		t.Fatalf("the whole file: %+v", res)
	}
	whole := sourcetest.Summarize(set.b.State())
	for _, at := range offsets {
		o.offsets++
		res := load(full[:at])
		o.judge(t, at, string(full[max(0, at-40):at]), res, whole, sourcetest.Summarize(set.b.State()))
		if res.held == 0 && len(res.failures) == 0 {
			// Read as it is: back to the whole file. A held or refused
			// one left the whole file's contents in place.
			if res := load(full); !res.complete {
				t.Fatalf("the whole file again: %+v", res)
			}
		}
	}
}

func pct(n, of int) float64 { return 100 * float64(n) / float64(of) }

// everyOffsetOfThree is every offset inside the three Services' documents
// (or list items) before the last one.
func everyOffsetOfThree(full []byte) []int {
	var starts []int
	for _, sep := range []string{"\n---\n", "\n- apiVersion", "\n        {\n"} {
		for i := 0; ; {
			j := strings.Index(string(full[i:]), sep)
			if j < 0 {
				break
			}
			starts = append(starts, i+j+1)
			i += j + 1
		}
	}
	slices.Sort(starts)
	var offsets []int
	for at := starts[len(starts)-4]; at < starts[len(starts)-1]; at++ {
		offsets = append(offsets, at)
	}
	return offsets
}

// judge sorts out one cut, failing the test if Services went silently.
func (o *truncationOutcome) judge(t *testing.T, at int, ends string, res reloadResult, whole, now []string) {
	switch {
	case res.held > 0:
		o.held++
		return
	case len(res.failures) > 0:
		o.failed++
		return
	case slices.Equal(whole, now):
		o.same++
		return
	}
	var said []string
	for _, r := range res.removed {
		said = append(said, r.namespace+"/"+r.name)
	}
	for _, p := range res.problems {
		if !manifest.IsWarning(p) {
			said = append(said, p.Error())
		}
	}
	mentioned := func(svc string) bool {
		name, _, _ := strings.Cut(svc, ":")
		return slices.ContainsFunc(said, func(s string) bool { return s == name || strings.Contains(s, "service "+name+":") })
	}
	lost := 0
	for _, s := range whole {
		if !slices.Contains(now, s) && !slices.ContainsFunc(now, func(n string) bool { return strings.HasPrefix(n, strings.Fields(s)[0]+" ") }) {
			lost++
			if !mentioned(strings.Fields(s)[0]) {
				t.Errorf("cut at %d: %s removed without a word", at, s)
			}
		}
	}
	switch {
	case len(res.removed) > 0:
		o.logged++
		if testing.Verbose() {
			t.Logf("cut at %d: read as it is, removal logged; it ends %q", at, ends)
		}
	case lost > 0:
		o.warned++
	default:
		o.altered++
		if o.altered <= 3 || testing.Verbose() {
			t.Logf("cut at %d: altered: %v", at, diff(whole, now))
		}
	}
}

// diff lists what is in one list and not the other.
func diff(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, "-"+s)
		}
	}
	for _, s := range b {
		if !slices.Contains(a, s) {
			out = append(out, "+"+s)
		}
	}
	return out
}

var truncationRandom = flag.Int("truncation-random", 30, "TestTruncatedStateFile: random cuts of the file of 300 Services, per format")
