package manifest

import (
	"strings"
	"testing"
)

func TestCutShort(t *testing.T) {
	svc := "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n"
	tests := []struct {
		name, in string
		reason   string // "" when whole
		strong   bool
	}{
		{"whole", svc, "", false},
		{"whole, two documents", svc + "---\n" + svc, "", false},
		{"whole, ends with a comment", svc + "# end\n", "", false},
		{"whole, ends with ---", svc + "---\n", "", false},
		{"empty", "", "", false},
		{"only comments", "# nothing\n", "", false},
		{"JSON without a final newline", `{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}}`, "", false},
		{"flow mapping value last", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n", "", false},
		{"a value ending in a colon", svc + "  selector: {app: a}\n  note: \"x:\"\n", "", false},
		{"no final newline", strings.TrimSuffix(svc, "\n"), "in the middle of a line", false},
		{"cut in a word", svc[:strings.Index(svc, "0.1\n")], "in the middle of a line", false},
		{"a Service without the status the others have", strings.Repeat(svc+"status: {}\n---\n", 2) + svc, `has no "status", which the 2 Services before it all have`, true},
		{"a hole is no cut", strings.Repeat(svc+"status: {}\n---\n", 2) + strings.Replace(svc, "apiVersion: v1\n", "", 1), "", false},
		{"one other is not enough", svc + "status: {}\n---\n" + svc, "", false},
		{"other kinds do not count", "kind: Node\nstatus: {}\n---\nkind: Node\nstatus: {}\n---\n" + svc, "", false},
		{"cut after ---", svc + "---", "in the middle of a line", false},
		{"key without value", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n", `"spec:" opens a block`, true},
		{"list item key", "apiVersion: v1\nkind: Service\nspec:\n  ports:\n  - name: a\n    port: 80\n  - targetPort:\n", `"- targetPort:" opens a block`, true},
		{"block scalar header", svc + "  note: |-\n", `"note: |-" opens a block`, true},
		{"key then comment", "apiVersion: v1\nkind: Service\nspec:\n# later\n", `"spec:" opens a block`, true},
		{"List cut in its items", "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n", "has no kind", true},
	}
	dec, err := NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, tail := dec.DecodeWithTail([]byte(tt.in), "f.yaml")
			reason, strong := tail.CutShort([]byte(tt.in))
			if tt.reason == "" && reason != "" || !strings.Contains(reason, tt.reason) || strong != tt.strong {
				t.Errorf("CutShort = %q, %v; want %q, %v", reason, strong, tt.reason, tt.strong)
			}
		})
	}
}
