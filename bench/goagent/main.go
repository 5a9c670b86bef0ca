// Command goagent is the bench's reference: a client-go agent that labels its Node the way OME's
// model-agent does (baseline v0.1.5, see ../shared/spec/ome-model-agent.md §3), and the watch-based
// probe that times any agent's labels. Built offline inside the kubernetes v1.20.2 source tree
// (vendored client-go) by scripts/bench-agent; see README.md there.
//
//	goagent agent -kubeconfig K -node N [-workers 2] [-qps 100] [-burst 200]
//	goagent probe -kubeconfig K -node N -dir D -prefix P [-count 20]
//	goagent wait-ready -kubeconfig K -node N -count C
package main

import (
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: goagent agent|probe|wait-ready [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "agent":
		err = runAgent(os.Args[2:])
	case "probe":
		err = runProbe(os.Args[2:])
	case "wait-ready":
		err = runWaitReady(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "goagent:", err)
		os.Exit(1)
	}
}

func restConfig(kubeconfig string, qps float32, burst int) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = qps, burst
	return cfg, nil
}
