package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	proxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

const (
	configAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	configKind       = "KubeProxyConfiguration"
)

// loadConfig reads a KubeProxyConfiguration (strictly: unknown fields are
// errors) and takes every setting from it (configFields), as kube-proxy
// does: the flags given on the command line that set a field of the file
// are ignored (with a warning, noteIgnoredFlags), but for
// --hostname-override, which wins over the file's, and the logging flags,
// which win over its logging block. A field the file leaves zero gets
// kube-proxy's default.
func (o *options) loadConfig(path string, fs *pflag.FlagSet) error {
	data, err := readConfigFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	c, err := decodeConfig(data)
	if err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	o.configData = data
	if err := o.ignoreFlagsUnderConfig(fs); err != nil {
		return err
	}
	if err := errors.Join(checkMode(string(c.Mode)), checkConfigPeriods(c)); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	if c.OOMScoreAdj != nil {
		if err := validateOOMScoreAdj("oomScoreAdj", *c.OOMScoreAdj); err != nil {
			return fmt.Errorf("--config %s: %w", path, err)
		}
	}
	if err := o.loadLoggingConfig(c, fs); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	// The one default of a KubeProxyConfiguration that differs from its
	// flag's: kube-proxy's v1alpha1 defaulting leaves ipvs.minSyncPeriod 0,
	// where --ipvs-min-sync-period defaults to 1s.
	o.ipvs.minSyncPeriod = 0
	hostname := o.hostnameOverride
	for _, f := range configFields() {
		if f.load != nil {
			f.load(c, o)
		}
	}
	// As kube-proxy: a non-blank --hostname-override wins over the file.
	if strings.TrimSpace(hostname) != "" {
		o.hostnameOverride = hostname
	}
	return nil
}

// maxConfigBytes bounds the --config file: a KubeProxyConfiguration with
// every field set is about 2 KiB, so a larger file is not one (and
// /dev/zero would otherwise be read until memory runs out).
const maxConfigBytes = 1 << 20

// readConfigFile reads the --config file, refusing one over maxConfigBytes.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a KubeProxyConfiguration", path, maxConfigBytes)
	}
	return data, nil
}

// decodeConfig decodes a KubeProxyConfiguration as kube-proxy's strict
// decoder does (apimachinery's YAML serializer): field names are
// case-sensitive, so "clusterCidr" is an unknown field, not clusterCIDR;
// unknown and duplicate fields are errors that name them ("strict decoding
// error: unknown field \"clusterCidr\""). kube-proxy, for v1alpha1 only,
// then logs that error and decodes again leniently, ignoring those fields;
// we refuse the file instead, so that a misspelt setting is never silently
// dropped.
//
// A file of several YAML documents is refused: kube-proxy's decoder reads
// the first one and silently drops the rest, so that settings in a later
// document (or a second KubeProxyConfiguration) would never apply.
func decodeConfig(data []byte) (*proxyconfig.KubeProxyConfiguration, error) {
	if err := checkOneDocument(data); err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, err
	}
	if tm.APIVersion != configAPIVersion || tm.Kind != configKind {
		return nil, fmt.Errorf("want apiVersion %s, kind %s; got %q, %q", configAPIVersion, configKind, tm.APIVersion, tm.Kind)
	}
	scheme := runtime.NewScheme()
	if err := proxyconfig.AddToScheme(scheme); err != nil {
		return nil, err
	}
	dec := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
	c := &proxyconfig.KubeProxyConfiguration{}
	if _, _, err := dec.Decode(data, nil, c); err != nil {
		return nil, err
	}
	return c, nil
}

// checkOneDocument fails when data holds more than one YAML document with
// content: a leading "---", or an empty or comment-only document, is fine.
func checkOneDocument(data []byte) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	docs := 0
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("splitting YAML documents: %w", err)
		}
		var v any
		if err := yaml.Unmarshal(doc, &v); err == nil && v == nil {
			continue // nothing but comments or blanks
		}
		if docs++; docs > 1 {
			return fmt.Errorf("holds more than one YAML document (separated by \"---\"); " +
				"a KubeProxyConfiguration file must hold exactly one (kube-proxy would use the first and silently ignore the rest)")
		}
	}
}

// checkConfigPeriods checks the sync periods of a config file as kube-proxy's
// validation does: a zero period means "the default" (as in kube-proxy's
// defaulting), a negative one is refused, naming the field.
func checkConfigPeriods(c *proxyconfig.KubeProxyConfiguration) error {
	for _, p := range []struct {
		field string
		d     time.Duration
		min   bool
	}{
		{"nftables.syncPeriod", c.NFTables.SyncPeriod.Duration, false},
		{"nftables.minSyncPeriod", c.NFTables.MinSyncPeriod.Duration, true},
		{"iptables.syncPeriod", c.IPTables.SyncPeriod.Duration, false},
		{"iptables.minSyncPeriod", c.IPTables.MinSyncPeriod.Duration, true},
		{"ipvs.syncPeriod", c.IPVS.SyncPeriod.Duration, false},
		{"ipvs.minSyncPeriod", c.IPVS.MinSyncPeriod.Duration, true},
	} {
		if p.d == 0 {
			continue // the default
		}
		if err := checkPeriod(p.field, p.d, p.min); err != nil {
			return err
		}
	}
	return nil
}

// checkPeriod applies kube-proxy's rule to one sync period: syncPeriod
// must be greater than 0 (0 would sync without pause), minSyncPeriod
// greater than or equal to 0 (0: every change syncs at once).
func checkPeriod(name string, d time.Duration, isMin bool) error {
	switch {
	case isMin && d < 0:
		return fmt.Errorf("%s %s: must be greater than or equal to 0", name, d)
	case !isMin && d <= 0:
		return fmt.Errorf("%s %s: must be greater than 0", name, d)
	}
	return nil
}

// validatePeriods checks the effective --iptables-*sync-period settings
// (those of nftables mode) as kube-proxy validates them: the sync period
// greater than 0, the minimum one greater than or equal to 0 and not
// greater than the sync period. The --ipvs-* ones are checked by
// ipvsOptions.validate in ipvs mode.
func (o *options) validatePeriods() error {
	if err := checkPeriod("--iptables-sync-period", o.syncPeriod, false); err != nil {
		return err
	}
	if err := checkPeriod("--iptables-min-sync-period", o.minSyncPeriod, true); err != nil {
		return err
	}
	if o.minSyncPeriod > o.syncPeriod {
		return fmt.Errorf("--iptables-sync-period %s: must be greater than or equal to --iptables-min-sync-period %s", o.syncPeriod, o.minSyncPeriod)
	}
	return nil
}

// checkMode accepts the proxy modes we implement.
func checkMode(mode string) error {
	switch mode {
	case "", modeNFTables, modeIPTables, modeIPVS:
		return nil
	}
	return fmt.Errorf("proxy mode %q is not supported: kube-nftproxy implements nftables, iptables (programmed as nftables) and ipvs", mode)
}

// writeConfig writes the effective settings as a KubeProxyConfiguration,
// as --write-config-to does.
func (o *options) writeConfig(path string) error {
	c := kubeProxyConfig{TypeMeta: metav1.TypeMeta{APIVersion: configAPIVersion, Kind: configKind}}
	for _, f := range configFields() {
		f.store(o, &c)
	}
	c.Logging = o.logging
	data, err := yaml.Marshal(c)
	if err != nil {
		return fmt.Errorf("encoding the configuration: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	return nil
}
