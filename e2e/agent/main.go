// Command e2e-agent is the traffic end of the kernel tests and the demo,
// meant to run inside the sandbox's namespaces:
//
//	e2e-agent serve --name NAME [--tcp :8080] [--udp :5353]
//	e2e-agent client (--tcp | --udp) HOST:PORT [--count N] [--timeout D]
//	          [--interval D] [--duration D] [--src-port P] [--src ADDR]
//	          [--until-fail | --until-ok] [--results none|failed|all] [--announce N]
//	e2e-agent loop (--tcp | --udp) HOST:PORT --duration D [...client flags]
//	e2e-agent squat @NAME
//
// serve answers each TCP connection (a raw line, or an HTTP response to an
// HTTP request, for curl) and each UDP datagram with "NAME SRC-IP:PORT",
// on IPv4 and IPv6, until SIGTERM or SIGINT.
//
// client sends the requests one after the other, each over a new
// connection or socket, and prints a JSON summary (see echo.Summary) on
// standard output:
//
//	{"target":"tcp 10.96.0.10:80","ok":10,"failed":0,"backends":{"pod-a":6,"pod-b":4},"sources":{"10.244.0.10":10},...}
//
// It exits 0 if every request got a reply (with --until-ok: if one did), 1
// otherwise, 2 on a usage error. loop is client with --count 0 (as many as
// fit in --duration), no interval and --results failed: for watching a
// path while the rules change under it.
//
// squat listens on the unix socket NAME (abstract with a leading @), says
// "squatting NAME uid=UID" and holds it until SIGTERM or SIGINT: a process
// of the node that takes a name before the proxy does.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
)

const usage = `usage:
  e2e-agent serve --name NAME [--tcp :8080] [--udp :5353]
  e2e-agent client (--tcp | --udp) HOST:PORT [--count N] [--timeout D] [--interval D]
            [--duration D] [--src-port P] [--src ADDR] [--until-fail | --until-ok] [--results none|failed|all]
            [--announce N]
  e2e-agent loop (--tcp | --udp) HOST:PORT --duration D [client flags]
  e2e-agent squat @NAME
`

func main() {
	log.SetFlags(0)
	log.SetPrefix("e2e-agent: ")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], stderr)
	case "client":
		return client(ctx, args[1:], false, stdout, stderr)
	case "loop":
		return client(ctx, args[1:], true, stdout, stderr)
	case "squat":
		err = squat(ctx, args[1:], stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "e2e-agent: unknown command %q\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "e2e-agent %s: %v\n", args[0], err)
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	}
	return 0
}

type usageError struct{ error }

func squat(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return usageError{errors.New("need one unix socket name")}
	}
	l, err := net.Listen("unix", args[0])
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(stdout, "squatting %s uid=%d\n", args[0], os.Getuid())
	<-ctx.Done()
	return nil
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "name to answer with (required)")
	tcp := fs.String("tcp", ":8080", "TCP address to listen on; empty for none; no host means IPv4 and IPv6")
	udp := fs.String("udp", ":5353", "UDP address to listen on; empty for none; no host means IPv4 and IPv6")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *name == "" || fs.NArg() > 0 {
		return usageError{errors.New("need --name and no arguments")}
	}
	logger := log.New(stderr, *name+": ", log.LstdFlags)
	srv, err := echo.Listen(*name, *tcp, *udp)
	if err != nil {
		return err
	}
	srv.Logf = logger.Printf
	logger.Printf("serving on %v", srv.Addrs())
	if err := srv.Serve(ctx); err != nil {
		return err
	}
	logger.Printf("stopped")
	return nil
}

func client(ctx context.Context, args []string, loop bool, stdout, stderr io.Writer) int {
	name := "client"
	if loop {
		name = "loop"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg echo.ClientConfig
	tcp := fs.String("tcp", "", "TCP server HOST:PORT")
	udp := fs.String("udp", "", "UDP server HOST:PORT")
	fs.IntVar(&cfg.Count, "count", 1, "requests to send; 0: as many as fit in --duration")
	fs.DurationVar(&cfg.Timeout, "timeout", time.Second, "timeout of each request")
	fs.DurationVar(&cfg.Interval, "interval", 0, "pause between requests")
	fs.DurationVar(&cfg.Duration, "duration", 0, "bound on the whole run (0: none beyond count x timeout)")
	fs.IntVar(&cfg.SrcPort, "src-port", 0, "fixed source port")
	src := fs.String("src", "", "source address (one of this namespace's)")
	fs.BoolVar(&cfg.UntilFail, "until-fail", false, "stop at the first failure")
	fs.BoolVar(&cfg.UntilOK, "until-ok", false, "stop at the first reply")
	fs.StringVar(&cfg.Results, "results", echo.ResultsNone, "per-request results to list: none, failed or all")
	announce := fs.Int("announce", 0, "print \"N replies\" on stderr when the Nth reply arrives (0: never)")
	if loop {
		cfg.Count = 0
		cfg.Results = echo.ResultsFailed
		fs.Lookup("count").DefValue = "0"
		fs.Lookup("results").DefValue = echo.ResultsFailed
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *src != "" {
		a, err := netip.ParseAddr(*src)
		if err != nil {
			fmt.Fprintf(stderr, "e2e-agent: --src %q: %v\n", *src, err)
			return 2
		}
		cfg.SrcAddr = a
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "e2e-agent %s: unexpected arguments %q\n", name, fs.Args())
		return 2
	case (*tcp == "") == (*udp == ""):
		fmt.Fprintf(stderr, "e2e-agent %s: need exactly one of --tcp and --udp\n", name)
		return 2
	case *tcp != "":
		cfg.Network, cfg.Addr = "tcp", *tcp
	default:
		cfg.Network, cfg.Addr = "udp", *udp
	}
	if loop && cfg.Duration <= 0 {
		fmt.Fprintf(stderr, "e2e-agent loop: need --duration\n")
		return 2
	}
	if *announce > 0 {
		cfg.OnReply = func(ok int) {
			if ok == *announce {
				fmt.Fprintf(stderr, "%d replies\n", ok)
			}
		}
	}
	sum, err := echo.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "e2e-agent %s: %v\n", name, err)
		return 2
	}
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(sum); err != nil {
		fmt.Fprintf(stderr, "e2e-agent %s: %v\n", name, err)
		return 1
	}
	if !sum.Success(cfg.UntilOK) {
		return 1
	}
	return 0
}
