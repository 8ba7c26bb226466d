// Command robustness runs the robustness suite's long profile: runs of randomized traffic
// against a fresh cluster (kvd or etcd) while faults are injected, each run's histories
// checked (porcupine for the KV operations, the watch guarantees, the members' final state).
// Each run prints its seed; -seed replays a run's fault schedule and traffic mix.
//
//	go run ./cmd/robustness -bin target/release/kvd -members 3 -duration 5m -runs 6
//
// Exits 1 if any run found a violation (its records stay in -dir).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"kvd.test/clients/go/internal/harness"
	"kvd.test/clients/go/robustness"
)

// runner is a harness.TB outside `go test`: Fatalf ends the run, Cleanup runs at its end.
type runner struct {
	cleanups []func()
	failed   bool
}

type fatal struct{ msg string }

func (r *runner) Helper()                      {}
func (r *runner) Logf(f string, args ...any)   { fmt.Printf("  "+f+"\n", args...) }
func (r *runner) Cleanup(f func())             { r.cleanups = append(r.cleanups, f) }
func (r *runner) Fatalf(f string, args ...any) { panic(fatal{fmt.Sprintf(f, args...)}) }

func (r *runner) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

var _ harness.TB = (*runner)(nil)

func main() {
	bin := flag.String("bin", "", "the kvd or etcd binary")
	members := flag.Int("members", 3, "members per cluster")
	duration := flag.Duration("duration", 5*time.Minute, "each run's traffic")
	runs := flag.Int("runs", 1, "runs, each on a fresh cluster with its own seed")
	seed := flag.Int64("seed", 0, "the first run's seed (0: from the clock); run k uses seed+k")
	clients := flag.Int("clients", 6, "clients, each with its own connections")
	watchers := flag.Int("watchers", 3, "watchers of every key")
	faults := flag.String("faults", "all", "faults to inject, comma-separated, or all, or none")
	check := flag.Duration("check-timeout", 2*time.Minute, "the most porcupine may take over one run's history, in all its ranges of revisions (past it the run fails as unchecked)")
	dir := flag.String("dir", "", "where runs keep their data and logs (default a temporary directory; kept for failed runs)")
	profiles := flag.String("profile", "both", "traffic: etcd, kubernetes, or both (runs alternate, etcd first)")
	flag.Parse()
	var use []robustness.Profile
	switch *profiles {
	case "both":
		use = []robustness.Profile{robustness.Etcd, robustness.Kubernetes}
	default:
		p, ok := robustness.Profiles[*profiles]
		if !ok {
			fmt.Fprintf(os.Stderr, "robustness: no profile %q\n", *profiles)
			os.Exit(2)
		}
		use = []robustness.Profile{p}
	}
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "robustness: -bin is required")
		os.Exit(2)
	}
	abs, err := filepath.Abs(*bin)
	if err == nil {
		*bin = abs
	}
	var names []string
	switch *faults {
	case "all":
		for n := range robustness.Faults {
			names = append(names, n)
		}
	case "none":
	default:
		for _, n := range strings.Split(*faults, ",") {
			if _, ok := robustness.Faults[n]; !ok {
				fmt.Fprintf(os.Stderr, "robustness: no fault %q\n", n)
				os.Exit(2)
			}
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if *seed == 0 {
		*seed = time.Now().UnixNano() % 1_000_000
	}
	bad := 0
	var ops, unknown, events, injected, violations, lists, expired int
	for k := 0; k < *runs; k++ {
		s := *seed + int64(k)
		base := *dir
		if base == "" {
			base = os.TempDir()
		}
		runDir, err := os.MkdirTemp(base, fmt.Sprintf("robustness-%d-", s))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		profile := use[k%len(use)]
		fmt.Printf("run %d of %d: seed %d, %s, %d members, %s profile, %s, in %s\n", k+1, *runs, s, filepath.Base(*bin), *members, profile.Name, *duration, runDir)
		rep, msg := run(robustness.Config{
			Bin: *bin, Members: *members, Duration: *duration, Clients: *clients, Watchers: *watchers,
			Faults: names, Seed: s, Dir: runDir, Profile: profile, CheckTimeout: *check,
		})
		if msg != "" {
			fmt.Printf("run %d: stopped: %s\n", k+1, msg)
			bad++
			continue
		}
		fmt.Print(rep.Summary())
		ops += rep.Operations
		unknown += rep.Unknown
		events += rep.Events
		lists += rep.Lists
		expired += rep.Expired
		injected += len(rep.Faults)
		violations += len(rep.Violations)
		if len(rep.Violations) > 0 {
			bad++
			fmt.Printf("run %d: records kept in %s\n", k+1, runDir)
		} else {
			os.RemoveAll(runDir)
		}
	}
	fmt.Printf("TOTAL %s, %d members, %d runs of %s: %d operations answered, %d of unknown outcome, %d watch events checked, %d lists at a revision checked, %d lease expiries checked, %d faults injected, %d runs failed, %d violations\n",
		filepath.Base(*bin), *members, *runs, *duration, ops, unknown, events, lists, expired, injected, bad, violations)
	if bad > 0 {
		os.Exit(1)
	}
}

// run is one run, its cleanups done (processes killed) before it returns.
func run(cfg robustness.Config) (rep *robustness.Report, msg string) {
	r := &runner{}
	defer r.close()
	defer func() {
		if x := recover(); x != nil {
			f, ok := x.(fatal)
			if !ok {
				panic(x)
			}
			msg = f.msg
		}
	}()
	return robustness.Run(r, cfg), ""
}
