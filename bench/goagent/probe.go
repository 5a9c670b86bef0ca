package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// A probe waits this long for a label at most.
const probeTimeout = 30 * time.Second

// seen is one state of the Node's labels, stamped when its watch event arrived.
type seen struct {
	at     time.Time
	labels map[string]string
}

// nodeWatch streams the Node's labels as its watch delivers them, stamped on arrival by a
// goroutine of its own (so that the stamp never waits on the probe's other calls). It re-watches
// from the last resourceVersion when the server ends a watch.
func nodeWatch(ctx context.Context, kube kubernetes.Interface, node string) (<-chan seen, error) {
	first, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out := make(chan seen, 1024)
	out <- seen{at: time.Now(), labels: first.Labels}
	go func() {
		version := first.ResourceVersion
		for ctx.Err() == nil {
			w, err := kube.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
				FieldSelector: "metadata.name=" + node, ResourceVersion: version})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for event := range w.ResultChan() {
				n, ok := event.Object.(*corev1.Node)
				if !ok || event.Type == watch.Error {
					continue
				}
				version = n.ResourceVersion
				out <- seen{at: time.Now(), labels: n.Labels}
			}
		}
	}()
	return out, nil
}

// await returns when `done` holds for the labels seen, with the arrival time of that event.
func await(events <-chan seen, done func(map[string]string) bool) (time.Time, error) {
	timeout := time.After(probeTimeout)
	for {
		select {
		case s := <-events:
			if done(s.labels) {
				return s.at, nil
			}
		case <-timeout:
			return time.Time{}, fmt.Errorf("not seen within %v", probeTimeout)
		}
	}
}

func runProbe(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (creates and deletes ClusterBaseModels)")
	node := fs.String("node", "", "the node whose agent is timed")
	dir := fs.String("dir", "", "the local:// directory of the probe models")
	selector := fs.String("selector", "bench=yes", "the probe models' nodeSelector, k=v")
	prefix := fs.String("prefix", "probe", "probe model names: <prefix>-<n>")
	count := fs.Int("count", 20, "probes")
	fs.Parse(args)
	cfg, err := restConfig(*kubeconfig, 1000, 1000)
	if err != nil {
		return err
	}
	ctx := context.Background()
	events, err := nodeWatch(ctx, kubernetes.NewForConfigOrDie(cfg), *node)
	if err != nil {
		return err
	}
	models := dynamic.NewForConfigOrDie(cfg).Resource(
		schema.GroupVersionResource{Group: "ome.io", Version: "v1beta1", Resource: "clusterbasemodels"})
	sel := strings.SplitN(*selector, "=", 2)
	var latencies []float64
	for i := 1; i <= *count; i++ {
		name := fmt.Sprintf("%s-%03d", *prefix, i)
		ms, err := probeOnce(ctx, models, events, name, *dir, sel)
		if err != nil {
			return fmt.Errorf("%s: %v", name, err)
		}
		latencies = append(latencies, ms)
		fmt.Fprintf(os.Stderr, "probe %s: %.1f ms\n", name, ms)
	}
	fmt.Println(summary(latencies))
	return nil
}

// probeOnce: create one local:// model and time until the Node's watch shows its label Ready.
// The model stays (labelled bench/probe=yes; the bench deletes them while the agent is
// stopped): deleting one after each probe would trip model-agent's blast-radius breaker.
func probeOnce(ctx context.Context, models dynamic.NamespaceableResourceInterface, events <-chan seen,
	name, dir string, sel []string) (float64, error) {
	key := labelDomain + "/clusterbasemodel." + name
	obj := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "ome.io/v1beta1", "kind": "ClusterBaseModel",
		"metadata": map[string]interface{}{"name": name,
			"labels": map[string]interface{}{"bench/probe": "yes"}},
		"spec": map[string]interface{}{"storage": map[string]interface{}{
			"storageUri": "local://" + dir, "nodeSelector": map[string]interface{}{sel[0]: sel[1]}}},
	}}
	drain(events)
	started := time.Now()
	if _, err := models.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	ready, err := await(events, func(l map[string]string) bool { return l[key] == "Ready" })
	if err != nil {
		return 0, fmt.Errorf("label Ready: %v", err)
	}
	// Let the agent's ConfigMap write after the label settle before the next probe.
	time.Sleep(300 * time.Millisecond)
	return float64(ready.Sub(started).Microseconds()) / 1000, nil
}

func drain(events <-chan seen) {
	for {
		select {
		case <-events:
		default:
			return
		}
	}
}

// summary: median and p99 (nearest rank), min and max, in ms.
func summary(ms []float64) string {
	sort.Float64s(ms)
	rank := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(ms)))) - 1
		if i < 0 {
			i = 0
		}
		return ms[i]
	}
	median := (ms[(len(ms)-1)/2] + ms[len(ms)/2]) / 2
	return fmt.Sprintf("probes=%d median_ms=%.1f p99_ms=%.1f min_ms=%.1f max_ms=%.1f",
		len(ms), median, rank(0.99), ms[0], ms[len(ms)-1])
}

// runWaitReady returns once the Node carries at least -count model labels reading Ready.
func runWaitReady(args []string) error {
	fs := flag.NewFlagSet("wait-ready", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file")
	node := fs.String("node", "", "the node")
	count := fs.Int("count", 1, "Ready model labels to wait for")
	prefix := fs.String("prefix", labelDomain+"/clusterbasemodel.bench-", "count only labels with this prefix")
	timeout := fs.Duration("timeout", 20*time.Minute, "give up after")
	fs.Parse(args)
	cfg, err := restConfig(*kubeconfig, 100, 100)
	if err != nil {
		return err
	}
	events, err := nodeWatch(context.Background(), kubernetes.NewForConfigOrDie(cfg), *node)
	if err != nil {
		return err
	}
	deadline := time.After(*timeout)
	for {
		select {
		case s := <-events:
			if readyLabels(s.labels, *prefix) >= *count {
				return nil
			}
		case <-deadline:
			return fmt.Errorf("fewer than %d Ready labels after %v", *count, *timeout)
		}
	}
}

func readyLabels(labels map[string]string, prefix string) int {
	n := 0
	for k, v := range labels {
		if strings.HasPrefix(k, prefix) && v == "Ready" {
			n++
		}
	}
	return n
}
