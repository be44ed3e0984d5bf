package main

import (
	"bytes"
	"strings"
	"testing"
)

func run(args ...string) (string, error) {
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String() + errOut.String(), err
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"render"}, "render needs --state"},
		{[]string{"render", "--state", "../../examples/demo", "--cluster-cidr", "10.0.0.0/33"}, "--cluster-cidr"},
		{[]string{"render", "--state", "../../examples/demo", "--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"}, "one CIDR per IP family"},
		{[]string{"render", "--state", "../../examples/demo", "--iptables-masquerade-bit", "32"}, "within 0-31"},
		{[]string{"render", "--state", "/nonexistent"}, "/nonexistent"},
		{[]string{}, "no --state, --kubeconfig or --master"},
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, err := run(tt.args...)
			if err == nil || !strings.Contains(err.Error()+out, tt.want) {
				t.Errorf("err = %v, output %q; want an error mentioning %q", err, out, tt.want)
			}
		})
	}
}

func TestRender(t *testing.T) {
	out, err := run("render", "--state", "../../examples/demo", "--hostname-override", "node-1",
		"--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"table ip kube-nftproxy {",
		"table ip6 kube-nftproxy {",
		"chain KUBE-SVC-CDGGSHYLG3RE2FKL {",
		`comment "default/web:http"`,
		"ip saddr != 10.244.0.0/16 jump KUBE-MARK-MASQ",
		"udp . 30053",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("render output lacks %q", want)
		}
	}
}

func TestVersion(t *testing.T) {
	out, err := run("version")
	if err != nil || !strings.HasPrefix(out, "kube-nftproxy ") {
		t.Errorf("version: %q, %v", out, err)
	}
}
