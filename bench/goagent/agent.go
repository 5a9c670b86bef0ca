package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// OME's constants (pkg/constants): label domain, label-name budget of a ClusterBaseModel,
// attempts of one label operation and the pause between them.
const (
	labelDomain       = "models.ome.io"
	clusterNameBudget = 32
	labelAttempts     = 5
	labelRetryPause   = 100 * time.Millisecond
	configMapAttempts = 5
)

type task struct {
	deleting bool
	obj      *unstructured.Unstructured
}

type agent struct {
	kube      kubernetes.Interface
	node      string
	namespace string
	pending   int64
}

func runAgent(args []string) error {
	fs := flag.NewFlagSet("agent", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file")
	node := fs.String("node", os.Getenv("NODE_NAME"), "this node's name")
	namespace := fs.String("namespace", "ome", "namespace of the node ConfigMap")
	workers := fs.Int("workers", 2, "worker goroutines (OME's chart: 2)")
	qps := fs.Float64("qps", 100, "client-side rate limit, requests per second")
	burst := fs.Int("burst", 200, "client-side burst")
	fs.Parse(args)
	cfg, err := restConfig(*kubeconfig, float32(*qps), *burst)
	if err != nil {
		return err
	}
	a := &agent{kube: kubernetes.NewForConfigOrDie(cfg), node: *node, namespace: *namespace}
	ctx := context.Background()
	self, err := a.kube.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("GET node %s: %v", a.node, err)
	}
	tasks := make(chan task) // unbuffered, as OME's gopherTaskChan
	for i := 0; i < *workers; i++ {
		go a.work(tasks)
	}
	stop := make(chan struct{})
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dynamic.NewForConfigOrDie(cfg), 0)
	for _, resource := range []string{"clusterbasemodels", "basemodels"} {
		gvr := schema.GroupVersionResource{Group: "ome.io", Version: "v1beta1", Resource: resource}
		factory.ForResource(gvr).Informer().AddEventHandler(a.handlers(tasks, self.Labels))
	}
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	a.reportIdle()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	close(stop)
	return nil
}

// reportIdle says on stderr when the work of the initial list is done (nothing pending for 1 s).
func (a *agent) reportIdle() {
	quiet := 0
	for quiet < 10 {
		time.Sleep(100 * time.Millisecond)
		if atomic.LoadInt64(&a.pending) == 0 {
			quiet++
		} else {
			quiet = 0
		}
	}
	fmt.Fprintln(os.Stderr, "goagent: idle after the initial sync")
}

// handlers: Add → download (unless being deleted), Update with a new deletionTimestamp → delete,
// Delete → delete; only for models whose nodeSelector this node matches (OME's Scout).
func (a *agent) handlers(tasks chan<- task, nodeLabels map[string]string) cache.ResourceEventHandlerFuncs {
	send := func(obj interface{}, deleting bool) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || !selected(u, nodeLabels) {
			return
		}
		atomic.AddInt64(&a.pending, 1)
		tasks <- task{deleting: deleting, obj: u}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			if u, ok := obj.(*unstructured.Unstructured); ok && u.GetDeletionTimestamp() == nil {
				send(obj, false)
			}
		},
		UpdateFunc: func(old, obj interface{}) {
			o, ok1 := old.(*unstructured.Unstructured)
			u, ok2 := obj.(*unstructured.Unstructured)
			if ok1 && ok2 && o.GetDeletionTimestamp() == nil && u.GetDeletionTimestamp() != nil {
				send(obj, true)
			}
		},
		DeleteFunc: func(obj interface{}) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			send(obj, true)
		},
	}
}

func selected(u *unstructured.Unstructured, nodeLabels map[string]string) bool {
	selector, _, _ := unstructured.NestedStringMap(u.Object, "spec", "storage", "nodeSelector")
	for k, v := range selector {
		if nodeLabels[k] != v {
			return false
		}
	}
	return true
}

func (a *agent) work(tasks <-chan task) {
	for t := range tasks {
		key, cmKey := labelKey(t.obj), configMapKey(t.obj)
		if t.deleting {
			a.logErr(a.setLabel(key, ""))
			a.logErr(a.removeEntry(cmKey))
		} else {
			a.download(t.obj, key, cmKey)
		}
		atomic.AddInt64(&a.pending, -1)
	}
}

// download: OME's prologue (Updating), then local://'s check, then Ready or Failed, each as
// label first, then ConfigMap entry.
func (a *agent) download(u *unstructured.Unstructured, key, cmKey string) {
	a.setState(u, key, cmKey, "Updating")
	uri, _, _ := unstructured.NestedString(u.Object, "spec", "storage", "storageUri")
	path, _, _ := unstructured.NestedString(u.Object, "spec", "storage", "path")
	if !strings.HasPrefix(uri, "local://") {
		fmt.Fprintf(os.Stderr, "goagent: %s: only local:// is handled here\n", u.GetName())
		return
	}
	if path == "" {
		path = strings.TrimPrefix(uri, "local://")
	}
	if _, err := os.Stat(path); err != nil {
		a.setState(u, key, cmKey, "Failed")
		return
	}
	a.setState(u, key, cmKey, "Ready")
}

func (a *agent) setState(u *unstructured.Unstructured, key, cmKey, state string) {
	a.logErr(a.setLabel(key, state))
	entry, _ := json.Marshal(map[string]string{"name": u.GetName(), "status": state})
	a.logErr(a.putEntry(cmKey, string(entry)))
}

func (a *agent) logErr(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "goagent:", err)
	}
}

// setLabel is OME's applyNodeLabelOperation: GET the node, nothing to do when it already
// reads so, else a JSON patch (add, or remove for ""), retried on errors.
func (a *agent) setLabel(key, value string) error {
	var err error
	for attempt := 0; attempt < labelAttempts; attempt++ {
		if err = a.labelOnce(key, value); err == nil {
			return nil
		}
		time.Sleep(labelRetryPause)
	}
	return err
}

func (a *agent) labelOnce(key, value string) error {
	ctx := context.Background()
	node, err := a.kube.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	current, present := node.Labels[key]
	if (value == "" && !present) || (value != "" && current == value) {
		return nil
	}
	path := "/metadata/labels/" + strings.ReplaceAll(key, "/", "~1")
	op := map[string]string{"op": "add", "path": path, "value": value}
	if value == "" {
		op = map[string]string{"op": "remove", "path": path}
	}
	body, _ := json.Marshal([]map[string]string{op})
	_, err = a.kube.CoreV1().Nodes().Patch(ctx, a.node, types.JSONPatchType, body, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return nil
	}
	return err
}

func (a *agent) putEntry(cmKey, entry string) error {
	return a.updateConfigMap(func(data map[string]string) { data[cmKey] = entry })
}

func (a *agent) removeEntry(cmKey string) error {
	return a.updateConfigMap(func(data map[string]string) { delete(data, cmKey) })
}

// updateConfigMap: get-or-create the node's ConfigMap, change its data, update; a conflict
// reads again.
func (a *agent) updateConfigMap(change func(map[string]string)) error {
	ctx, cms := context.Background(), a.kube.CoreV1().ConfigMaps(a.namespace)
	var err error
	for attempt := 0; attempt < configMapAttempts; attempt++ {
		cm, getErr := cms.Get(ctx, a.node, metav1.GetOptions{})
		if apierrors.IsNotFound(getErr) {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: a.node, Namespace: a.namespace,
				Labels: map[string]string{"models.ome/basemodel-status": "true", "node": a.node}}}
			cm, getErr = cms.Create(ctx, cm, metav1.CreateOptions{})
		}
		if getErr != nil {
			err = getErr
			continue
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		change(cm.Data)
		if _, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err == nil || !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}

// labelKey: OME's label key; a name over its budget is cut to sha256[:8]-<last 23>.
func labelKey(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return labelDomain + "/clusterbasemodel." + truncated(u.GetName(), clusterNameBudget)
	}
	// Only the short form (namespace and name within 38 characters); the bench makes none.
	return labelDomain + "/" + u.GetNamespace() + ".basemodel." + u.GetName()
}

func configMapKey(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return "clusterbasemodel." + u.GetName()
	}
	return u.GetNamespace() + ".basemodel." + u.GetName()
}

func truncated(name string, budget int) string {
	if len(name) <= budget {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:])[:8] + "-" + name[len(name)-(budget-9):]
}
