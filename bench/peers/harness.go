package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/dedupnode/dedupnode/bench"
)

// Case is one measurement: a workload at one batch / pipeline depth.
type Case struct {
	Workload string `json:"workload"`
	Batch    int    `json:"batch"`
}

func (c Case) String() string { return fmt.Sprintf("%s b%d", c.Workload, c.Batch) }

// runCfg is shared by every case of a run.
type runCfg struct {
	Concurrency int
	Duration    time.Duration
	Warmup      time.Duration
	IDSize      int
	TTL         time.Duration
	Timeout     time.Duration
	Progress    io.Writer
}

// Instance is a running system under test.
type Instance interface {
	// Run measures one case.
	Run(ctx context.Context, c Case, rc runCfg) (*bench.Result, error)
	// Supports reports whether the system has an equivalent of the workload.
	Supports(workload string) bool
	// Close stops the system's processes.
	Close()
}

// system describes how to start one system variant and what to run on it.
type system struct {
	Key    string // stable id, e.g. "redis-always"
	Name   string // for the table
	Kind   string // "dedupnode", "single" or "replicated"
	Nodes  int
	Detail string // how it is configured and what the op is
	Start  func(ctx context.Context, e *env) (Instance, error)
	Quick  []Case
	Full   []Case
}

// runOps measures a peer with the shared loop: ops built per worker.
func runOps(ctx context.Context, sys string, c Case, rc runCfg, pids []int,
	newOp func(worker int, gen *bench.IDGen) (bench.Op, error)) (*bench.Result, error) {
	seed := bench.NewRunSeed()
	var c0, c1 cpuSample
	spec := bench.Spec{
		Label:       fmt.Sprintf("%-22s %-10s b%-3d", sys, c.Workload, c.Batch),
		Concurrency: rc.Concurrency,
		Batch:       c.Batch,
		Duration:    rc.Duration,
		Warmup:      rc.Warmup,
		Progress:    rc.Progress,
		OnMeasure: func(start bool) {
			if start {
				c0 = sampleCPU(pids)
			} else {
				c1 = sampleCPU(pids)
			}
		},
	}
	lr, err := bench.RunLoop(ctx, spec, func(w int) (bench.Op, error) {
		return newOp(w, bench.NewIDGen(seed, w, rc.IDSize))
	})
	if err != nil {
		return nil, err
	}
	res := &bench.Result{
		System:      sys,
		Workload:    c.Workload,
		Concurrency: rc.Concurrency,
		Batch:       c.Batch,
		IDSize:      rc.IDSize,
		TTLSec:      rc.TTL.Seconds(),
		StartedAt:   time.Now().UTC().Format(time.RFC3339),
	}
	bench.Summarize(res, lr.Rec, lr.Elapsed)
	fillCPU(res, c0, c1)
	note := lr.Stopped
	if lr.FirstError != "" {
		msg := lr.FirstError
		if len(msg) > 200 {
			msg = msg[:200]
		}
		if note != "" {
			note += "; "
		}
		note += "first error: " + msg
	}
	res.Note = note
	return res, nil
}

func fillCPU(res *bench.Result, c0, c1 cpuSample) {
	server, client := c1.server-c0.server, c1.self-c0.self
	res.ServerCPUSec = round3(server)
	res.ClientCPUSec = round3(client)
	res.OtherCPUSec = round3(max(0, (c1.machine-c0.machine)-server-client))
	if res.IDs > 0 && server > 0 {
		res.CPUUsPerID = round3(server * 1e6 / float64(res.IDs))
	}
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

// fanout runs f(i) for i in [0,n) concurrently and returns the first error.
func fanout(n int, f func(i int) error) error {
	if n == 1 {
		return f(0)
	}
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) { errs <- f(i) }(i)
	}
	var first error
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
