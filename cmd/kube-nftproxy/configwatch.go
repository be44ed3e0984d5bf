package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// errConfigChanged ends the proxy when its --config file changes, as
// kube-proxy exits then: the pod restarts with the new configuration (a
// ConfigMap edit reaches a running pod as a new file behind the path).
var errConfigChanged = errors.New("content of the proxy server's configuration file was updated")

// configPollPeriod is how often the --config file is read back. Reading
// the path each time (rather than watching one inode) also sees a
// ConfigMap's atomic symlink swap.
const configPollPeriod = 2 * time.Second

// runWatched runs the proxy until ctx ends or, with --config, until the
// file's content differs from what was loaded; then it returns
// errConfigChanged (a non-zero exit, as kube-proxy's).
func runWatched(ctx context.Context, o *options, log *slog.Logger) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if o.configFile != "" {
		go watchConfigFile(ctx, o.configFile, o.configData, configPollPeriod, cancel, log)
	}
	err := runProxy(ctx, o, log)
	if cause := context.Cause(ctx); errors.Is(cause, errConfigChanged) {
		return cause
	}
	return err
}

// watchConfigFile polls path every period and calls changed when its
// content is no longer loaded. A file that cannot be read (mid-swap) is
// read again at the next tick.
func watchConfigFile(ctx context.Context, path string, loaded []byte, period time.Duration, changed context.CancelCauseFunc, log *slog.Logger) {
	tickUntil(ctx, period, func() bool {
		data, err := readConfigFile(path)
		if err != nil {
			log.Debug("could not read the --config file; trying again", "file", path, "err", err)
			return false
		}
		if bytes.Equal(data, loaded) {
			return false
		}
		log.Info("the --config file changed; exiting so that the new configuration is loaded", "file", path)
		changed(fmt.Errorf("%w: %s", errConfigChanged, path))
		return true
	})
}

// tickUntil calls done every period until it returns true or ctx ends.
func tickUntil(ctx context.Context, period time.Duration, done func() bool) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if done() {
			return
		}
	}
}
