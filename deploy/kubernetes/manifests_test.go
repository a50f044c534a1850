// Package kubernetes checks the Kubernetes manifests in this directory
// (see README.md): every document decodes strictly into its typed API
// object, and what matters for pgfence holds (probes, resources, security
// context, no password outside a Secret, only real pgfence flags, Services
// that reach a pod; NetworkPolicies, PodDisruptionBudgets and PodMonitors:
// policy_test.go).
//
// It is a module of its own so that the main module does not depend on
// Kubernetes' packages. It builds pgfence from the repository (../..) once
// to learn the flags of 'pgfence serve'.
package kubernetes

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"
)

// kinds are the API objects the manifests may hold; any other apiVersion
// and kind is an error.
var kinds = map[string]func() any{
	"v1/ConfigMap":                       func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                          func() any { return &corev1.Secret{} },
	"v1/Service":                         func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                  func() any { return &corev1.ServiceAccount{} },
	"v1/PersistentVolumeClaim":           func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1/Deployment":                 func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                func() any { return &appsv1.StatefulSet{} },
	"apps/v1/DaemonSet":                  func() any { return &appsv1.DaemonSet{} },
	"policy/v1/PodDisruptionBudget":      func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy": func() any { return &networkingv1.NetworkPolicy{} },
	// The Prometheus Operator's, for pgfence-podmonitor.yaml.
	"monitoring.coreos.com/v1/PodMonitor": func() any { return &monitoringv1.PodMonitor{} },
}

// Files that must be here.
var wantFiles = []string{"pgfence-sidecar-app.yaml", "pgfence-beside-postgres.yaml", "example-secret.yaml", "pgfence-podmonitor.yaml"}

const (
	// exampleAnnotation marks a Secret as an example (example-secret.yaml).
	exampleAnnotation = "pgfence/example"
	// healthzDial is how long /healthz may spend trying Postgres
	// (proxy.Config.DialTimeout's default): a liveness or startup probe on
	// /healthz must wait longer, or it fails while Postgres is unreachable.
	healthzDial = 5 * time.Second
	// shutdownExtra is what pgfence takes on SIGTERM beyond
	// --drain-timeout: log lines written out (up to 2 s), the HTTP
	// server's shutdown (1 s), and a margin.
	shutdownExtra = 5 * time.Second
)

// serveFlags are the flags of 'pgfence serve', from its --help.
type serveFlags struct {
	names    map[string]bool
	isBool   map[string]bool
	defaults map[string]string
}

var flags serveFlags

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgfence-k8s-")
	if err == nil {
		flags, err = readServeFlags(dir)
		os.RemoveAll(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "manifests_test:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// readServeFlags builds pgfence from the repository into dir and parses
// 'pgfence serve --help'.
func readServeFlags(dir string) (serveFlags, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return serveFlags{}, err
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "pgfence")); err != nil {
		return serveFlags{}, fmt.Errorf("the repository root is not at ../..: %w", err)
	}
	bin := filepath.Join(dir, "pgfence")
	build := exec.Command("go", "build", "-o", bin, "./cmd/pgfence")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return serveFlags{}, fmt.Errorf("go build ./cmd/pgfence in %s: %v\n%s", root, err, out)
	}
	out, err := exec.Command(bin, "serve", "--help").Output()
	if err != nil {
		return serveFlags{}, fmt.Errorf("pgfence serve --help: %v", err)
	}
	return parseHelp(string(out))
}

// A flag line of cobra's help: "      --name type   usage (default x)"; a
// bool flag has no type.
var (
	flagLine    = regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)(?: ([a-zA-Z]+))?\s{2,}(.*)$`)
	defaultPart = regexp.MustCompile(`\(default (.*)\)$`)
)

func parseHelp(help string) (serveFlags, error) {
	f := serveFlags{names: map[string]bool{}, isBool: map[string]bool{}, defaults: map[string]string{}}
	for _, line := range strings.Split(help, "\n") {
		m := flagLine.FindStringSubmatch(line)
		if m == nil || m[1] == "help" {
			continue
		}
		f.names[m[1]] = true
		f.isBool[m[1]] = m[2] == ""
		if d := defaultPart.FindStringSubmatch(m[3]); d != nil {
			f.defaults[m[1]] = strings.Trim(d[1], `"`)
		}
	}
	// A help format this parser misreads must not pass every manifest.
	for _, want := range []string{"upstream", "listen", "metrics-listen", "guard", "token-setting", "drain-timeout"} {
		if !f.names[want] {
			return f, fmt.Errorf("pgfence serve --help: no --%s among the %d flags read; has the help format changed?\n%s", want, len(f.names), help)
		}
	}
	if f.defaults["metrics-listen"] == "" || f.defaults["drain-timeout"] == "" {
		return f, fmt.Errorf("pgfence serve --help: no default read for --metrics-listen or --drain-timeout")
	}
	return f, nil
}

// envFlag is the flag an environment variable PGFENCE_<FLAG> sets (as
// pgfence's loadEnv maps them), or "" if name is not of that form.
func envFlag(name string) string {
	rest, ok := strings.CutPrefix(name, "PGFENCE_")
	if !ok {
		return ""
	}
	return strings.ReplaceAll(strings.ToLower(rest), "_", "-")
}

// object is one decoded document.
type object struct {
	file string
	doc  int // 1-based, among the file's documents
	kind string
	name string
	obj  any
}

func (o object) String() string { return fmt.Sprintf("%s: %s %s", o.file, o.kind, o.name) }

// readDir reads every *.yaml file of dir.
func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = b
	}
	return files
}

// decode splits every file into documents and decodes each strictly into
// the typed object of its kind: an unknown field (a misspelling, a wrong
// case), a duplicate field, a value of the wrong type or an unknown kind
// is a problem.
func decode(files map[string][]byte) ([]object, []string) {
	var objs []object
	var problems []string
	for _, file := range sortedKeys(files) {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(files[file])))
		for doc := 1; ; doc++ {
			raw, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: document %d: %v", file, doc, err))
				break
			}
			js, err := sigsyaml.YAMLToJSONStrict(raw)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: document %d: %v", file, doc, err))
				continue
			}
			if string(bytes.TrimSpace(js)) == "null" { // comments only
				doc--
				continue
			}
			var tm metav1.TypeMeta
			if err := json.Unmarshal(js, &tm); err != nil {
				problems = append(problems, fmt.Sprintf("%s: document %d: %v", file, doc, err))
				continue
			}
			kind := tm.APIVersion + "/" + tm.Kind
			newObj, ok := kinds[kind]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: document %d: unknown kind %q (apiVersion %q): add it to kinds if it is meant", file, doc, tm.Kind, tm.APIVersion))
				continue
			}
			obj := newObj()
			strict, err := sigsjson.UnmarshalStrict(js, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: document %d (%s): %v", file, doc, tm.Kind, err))
				continue
			}
			for _, e := range strict {
				problems = append(problems, fmt.Sprintf("%s: document %d (%s): %v", file, doc, tm.Kind, e))
			}
			meta := obj.(metav1.Object)
			if meta.GetName() == "" {
				problems = append(problems, fmt.Sprintf("%s: document %d (%s): no metadata.name", file, doc, tm.Kind))
			}
			objs = append(objs, object{file: file, doc: doc, kind: tm.Kind, name: meta.GetName(), obj: obj})
		}
	}
	return objs, problems
}

// workload is a pod template and what holds it.
type workload struct {
	object
	selector *metav1.LabelSelector
	template *corev1.PodTemplateSpec
}

func workloads(objs []object) []workload {
	var ws []workload
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *appsv1.Deployment:
			ws = append(ws, workload{o, v.Spec.Selector, &v.Spec.Template})
		case *appsv1.StatefulSet:
			ws = append(ws, workload{o, v.Spec.Selector, &v.Spec.Template})
		case *appsv1.DaemonSet:
			ws = append(ws, workload{o, v.Spec.Selector, &v.Spec.Template})
		}
	}
	return ws
}

// checker collects problems.
type checker struct {
	flags      serveFlags
	objs       []object
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	services   map[string]*corev1.Service
	problems   []string
}

func (c *checker) errorf(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// check runs every check on the decoded objects.
func check(objs []object, f serveFlags) []string {
	c := &checker{flags: f, objs: objs, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, services: map[string]*corev1.Service{}}
	seen := map[string]object{}
	filesWithWorkloads := map[string]bool{}
	for _, w := range workloads(objs) {
		filesWithWorkloads[w.file] = true
	}
	for _, o := range objs {
		if prev, ok := seen[o.kind+"/"+o.name]; ok {
			c.errorf("%v: defined again (first in %s); applying both files would overwrite one with the other", o, prev.file)
		}
		seen[o.kind+"/"+o.name] = o
		switch v := o.obj.(type) {
		case *corev1.ConfigMap:
			c.configMaps[o.name] = v
			c.checkConfigMap(o, v)
		case *corev1.Secret:
			c.secrets[o.name] = v
			if v.Annotations[exampleAnnotation] != "true" {
				c.errorf("%v: a Secret in a manifest must be an example, annotated %s: \"true\"; real ones are created with kubectl create secret", o, exampleAnnotation)
			}
			if filesWithWorkloads[o.file] {
				c.errorf("%v: a file that deploys workloads must not define Secrets (applying it would replace the real Secret); keep examples in example-secret.yaml", o)
			}
		case *corev1.Service:
			c.services[o.name] = v
		}
	}
	ws := workloads(objs)
	for _, w := range ws {
		c.checkWorkload(w)
	}
	for _, o := range objs {
		if s, ok := o.obj.(*corev1.Service); ok {
			c.checkService(o, s, ws)
		}
	}
	c.checkNetworkPolicies(objs, ws)
	c.checkDisruptionBudgets(objs, ws)
	c.checkPodMonitors(objs, ws)
	return c.problems
}

// password finds a password written into a value: a URL's user
// information, a keyword/value connection string, a password flag.
var passwordInText = regexp.MustCompile(`(?i)(\bpassword\s*=\s*\S|--?[a-z-]*passw(or)?d\b|://[^/@\s:]*:[^/@\s]+@)`)

// secretName is an environment variable whose value must come from a
// Secret.
var secretName = regexp.MustCompile(`(?i)(passw(or)?d|secret)`)

func (c *checker) checkConfigMap(o object, cm *corev1.ConfigMap) {
	for _, k := range sortedKeys(cm.Data) {
		v := cm.Data[k]
		if passwordInText.MatchString(v) || (secretName.MatchString(k) && v != "") {
			c.errorf("%v: %s holds a password; put it in a Secret and reference it with secretKeyRef", o, k)
		}
		if fl := envFlag(k); fl != "" && !c.flags.names[fl] {
			c.errorf("%v: %s sets --%s, which 'pgfence serve' does not have", o, k, fl)
		}
	}
	if v, ok := cm.Data["PGFENCE_TOKEN_SETTING"]; ok && !strings.Contains(v, ".") {
		c.errorf("%v: PGFENCE_TOKEN_SETTING %q: a custom Postgres setting must contain a dot", o, v)
	}
}

func (c *checker) checkWorkload(w workload) {
	tpl := w.template
	if w.selector == nil {
		c.errorf("%v: no spec.selector", w)
	} else if sel, err := metav1.LabelSelectorAsSelector(w.selector); err != nil {
		c.errorf("%v: spec.selector: %v", w, err)
	} else if sel.Empty() || !sel.Matches(labels.Set(tpl.Labels)) {
		c.errorf("%v: spec.selector %v does not select the pod template's labels %v", w, sel, tpl.Labels)
	}
	if ss, ok := w.obj.(*appsv1.StatefulSet); ok {
		svc := c.services[ss.Spec.ServiceName]
		switch {
		case ss.Spec.ServiceName == "":
		case svc == nil:
			c.errorf("%v: serviceName %q: no such Service here", w, ss.Spec.ServiceName)
		case svc.Spec.ClusterIP != corev1.ClusterIPNone:
			c.errorf("%v: serviceName %q: the governing Service must be headless (clusterIP: None)", w, ss.Spec.ServiceName)
		}
	}
	all := append(slices.Clone(tpl.Spec.InitContainers), tpl.Spec.Containers...)
	for i := range all {
		ct := &all[i]
		isInit := i < len(tpl.Spec.InitContainers)
		where := fmt.Sprintf("%v: container %s", w, ct.Name)
		c.checkAnyContainer(where, ct)
		if isPgfence(ct.Image) {
			c.checkPgfence(where, w, ct, isInit)
		}
	}
}

// checkAnyContainer checks what every container must get right.
func (c *checker) checkAnyContainer(where string, ct *corev1.Container) {
	if !fullyQualified(ct.Image) {
		c.errorf("%s: image %q: use a fully qualified name (registry host/repository) and a tag other than latest, or a digest", where, ct.Image)
	}
	for _, a := range append(slices.Clone(ct.Command), ct.Args...) {
		if passwordInText.MatchString(a) {
			c.errorf("%s: a password in command or args (%q): argv is visible to every process on the node; use PGPASSWORD from a Secret", where, a)
		}
	}
	names := map[string]bool{}
	for _, e := range ct.Env {
		if names[e.Name] {
			c.errorf("%s: env %s set twice", where, e.Name)
		}
		names[e.Name] = true
		if e.Value != "" && (secretName.MatchString(e.Name) || passwordInText.MatchString(e.Value)) {
			c.errorf("%s: env %s holds a password as a literal value; use valueFrom.secretKeyRef", where, e.Name)
		}
		if e.ValueFrom == nil {
			continue
		}
		if r := e.ValueFrom.SecretKeyRef; r != nil {
			c.needSecretKey(where, e.Name, r.Name, r.Key, r.Optional)
		}
		if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
			cm := c.configMaps[r.Name]
			if cm == nil {
				c.errorf("%s: env %s: no ConfigMap %q here", where, e.Name, r.Name)
			} else if _, ok := cm.Data[r.Key]; !ok && !isTrue(r.Optional) {
				c.errorf("%s: env %s: ConfigMap %q has no key %q", where, e.Name, r.Name, r.Key)
			}
		}
	}
	for _, ef := range ct.EnvFrom {
		if r := ef.ConfigMapRef; r != nil && c.configMaps[r.Name] == nil && !isTrue(r.Optional) {
			c.errorf("%s: envFrom: no ConfigMap %q here", where, r.Name)
		}
		if r := ef.SecretRef; r != nil && c.secrets[r.Name] == nil && !isTrue(r.Optional) {
			c.errorf("%s: envFrom: no Secret %q in example-secret.yaml", where, r.Name)
		}
	}
	for kind, p := range probes(ct) {
		if p == nil {
			continue
		}
		if port, ok := probePort(p); ok && port.Type == intstr.String {
			if _, found := namedPort(ct, port.StrVal); !found {
				c.errorf("%s: %s probe: no port named %q in the container", where, kind, port.StrVal)
			}
		}
	}
}

func (c *checker) needSecretKey(where, env, name, key string, optional *bool) {
	s := c.secrets[name]
	if s == nil {
		c.errorf("%s: env %s: no Secret %q in example-secret.yaml (document the Secrets the manifests read there)", where, env, name)
		return
	}
	_, inData := s.Data[key]
	_, inString := s.StringData[key]
	if !inData && !inString && !isTrue(optional) {
		c.errorf("%s: env %s: the example Secret %q has no key %q", where, env, name, key)
	}
}

// checkPgfence checks a pgfence container.
func (c *checker) checkPgfence(where string, w workload, ct *corev1.Container, isInit bool) {
	pod := &w.template.Spec
	if isInit && (ct.RestartPolicy == nil || *ct.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
		c.errorf("%s: pgfence as an init container needs restartPolicy: Always (a native sidecar); otherwise the pod waits for it to exit and never starts", where)
	}

	// The command line: 'serve' and real flags only.
	cli := map[string]string{}
	if len(ct.Command) > 0 {
		c.errorf("%s: command is set (%q): leave the image's entrypoint (pgfence) and put \"serve\" in args", where, ct.Command)
	}
	if len(ct.Args) == 0 || ct.Args[0] != "serve" {
		c.errorf("%s: args must start with \"serve\" (without args the image's CMD passes --listen and --metrics-listen, which win over PGFENCE_*)", where)
	}
	for i := 1; i < len(ct.Args); i++ {
		a := ct.Args[i]
		name, val, hasVal := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		switch {
		case !strings.HasPrefix(a, "--"):
			c.errorf("%s: args: %q is not a --flag of pgfence serve", where, a)
			continue
		case !c.flags.names[name]:
			c.errorf("%s: args: --%s is not a flag of pgfence serve", where, name)
			continue
		case !hasVal && !c.flags.isBool[name] && i+1 < len(ct.Args):
			i++
			val = ct.Args[i]
		case !hasVal && c.flags.isBool[name]:
			val = "true"
		}
		cli[name] = val
	}

	// The environment: PGFENCE_* names real flags.
	env := c.environment(ct)
	for _, name := range sortedKeys(env) {
		if fl := envFlag(name); fl != "" && !c.flags.names[fl] {
			c.errorf("%s: env %s sets --%s, which 'pgfence serve' does not have", where, name, fl)
		}
	}
	setting := func(flag string) string {
		if v, ok := cli[flag]; ok {
			return v
		}
		if v, ok := env["PGFENCE_"+strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))]; ok {
			return v
		}
		return c.flags.defaults[flag]
	}

	// The upstream and its password.
	up := setting("upstream")
	if up == "" {
		c.errorf("%s: no --upstream (PGFENCE_UPSTREAM)", where)
	}
	if u, err := url.Parse(up); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			c.errorf("%s: --upstream has a password in its URL; give it as PGPASSWORD from a Secret", where)
		}
	}
	if passwordInText.MatchString(up) {
		c.errorf("%s: --upstream holds a password; give it as PGPASSWORD from a Secret", where)
	}
	if !hasSecretEnv(ct, "PGPASSWORD") {
		c.errorf("%s: no PGPASSWORD from valueFrom.secretKeyRef: pgfence's upstream role needs its password from a Secret", where)
	}
	if ts := setting("token-setting"); !strings.Contains(ts, ".") {
		c.errorf("%s: --token-setting %q: a custom Postgres setting must contain a dot", where, ts)
	}

	// Listeners and ports: the kubelet and Prometheus reach the pod IP.
	metricsListen := setting("metrics-listen")
	metricsPort, metricsLoopback, err := splitListen(metricsListen)
	if err != nil {
		c.errorf("%s: --metrics-listen %q: %v (the probes need /healthz and /readyz)", where, metricsListen, err)
	} else if metricsLoopback {
		c.errorf("%s: --metrics-listen %q is a loopback address: the kubelet's probes and Prometheus reach the pod IP; use :%d", where, metricsListen, metricsPort)
	}
	listenPort, listenLoopback, lerr := splitListen(setting("listen"))
	for _, p := range ct.Ports {
		switch {
		case err == nil && p.ContainerPort == metricsPort:
		case lerr == nil && p.ContainerPort == listenPort:
			if listenLoopback {
				c.errorf("%s: port %s (%d) is declared but --listen %q is loopback-only", where, p.Name, p.ContainerPort, setting("listen"))
			}
		default:
			c.errorf("%s: port %s (%d) is neither --listen's nor --metrics-listen's port", where, p.Name, p.ContainerPort)
		}
	}

	// Probes: named ports on the metrics listener; /readyz for readiness,
	// /healthz for liveness, which must outwait /healthz's dial to Postgres.
	probeOn := func(kind string, p *corev1.Probe, path string, required bool) {
		if p == nil {
			if required {
				c.errorf("%s: no %s probe (HTTP GET %s on the metrics port)", where, kind, path)
			}
			return
		}
		if p.HTTPGet == nil {
			c.errorf("%s: %s probe: want HTTP GET %s on the metrics port", where, kind, path)
			return
		}
		if p.HTTPGet.Path != path && required {
			c.errorf("%s: %s probe: path %q, want %s", where, kind, p.HTTPGet.Path, path)
		}
		port := p.HTTPGet.Port
		if port.Type != intstr.String {
			c.errorf("%s: %s probe: port %s: use the container port's name", where, kind, port.String())
			return
		}
		cp, found := namedPort(ct, port.StrVal)
		if found && err == nil && cp.ContainerPort != metricsPort {
			c.errorf("%s: %s probe: port %s is %d, but --metrics-listen is %q", where, kind, port.StrVal, cp.ContainerPort, metricsListen)
		}
		if p.HTTPGet.Path == "/healthz" && time.Duration(timeout(p))*time.Second <= healthzDial {
			c.errorf("%s: %s probe: timeoutSeconds %d: /healthz tries Postgres for up to %v, so a shorter timeout fails it while Postgres is down; use more than %d", where, kind, timeout(p), healthzDial, int(healthzDial.Seconds()))
		}
	}
	probeOn("readiness", ct.ReadinessProbe, "/readyz", true)
	probeOn("liveness", ct.LivenessProbe, "/healthz", true)
	probeOn("startup", ct.StartupProbe, "/healthz", false)

	// Resources.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := ct.Resources.Requests[r]
		lim, hasLim := ct.Resources.Limits[r]
		if !hasReq {
			c.errorf("%s: no resources.requests.%s", where, r)
		}
		if !hasLim {
			c.errorf("%s: no resources.limits.%s", where, r)
		}
		if hasReq && hasLim && req.Cmp(lim) > 0 {
			c.errorf("%s: resources.requests.%s %s is above the limit %s", where, r, req.String(), lim.String())
		}
	}
	if v, ok := env["GOMEMLIMIT"]; ok {
		lim, hasLim := ct.Resources.Limits[corev1.ResourceMemory]
		n, perr := parseGoMemLimit(v)
		switch {
		case perr != nil:
			c.errorf("%s: GOMEMLIMIT %q: %v", where, v, perr)
		case hasLim && n >= lim.Value():
			c.errorf("%s: GOMEMLIMIT %q is not below the memory limit %s", where, v, lim.String())
		}
	}

	// Security context (the container's, else the pod's).
	sc := ct.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	nonRoot := firstBool(sc.RunAsNonRoot, psc.RunAsNonRoot)
	if !nonRoot {
		c.errorf("%s: runAsNonRoot is not true", where)
	}
	if uid := firstInt(sc.RunAsUser, psc.RunAsUser); uid == nil || *uid == 0 {
		c.errorf("%s: no non-zero runAsUser: the image's USER is a name (pgfence, uid 10001), which the kubelet cannot check against runAsNonRoot", where)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		c.errorf("%s: readOnlyRootFilesystem is not true", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		c.errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if isTrue(sc.Privileged) {
		c.errorf("%s: privileged", where)
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		c.errorf("%s: capabilities must drop ALL and add none", where)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil {
		seccomp = psc.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		c.errorf("%s: seccompProfile is not RuntimeDefault", where)
	}

	// Shutdown: SIGTERM drains for --drain-timeout.
	drainSetting := setting("drain-timeout")
	drain, derr := time.ParseDuration(drainSetting)
	if derr != nil {
		c.errorf("%s: --drain-timeout %q: %v", where, drainSetting, derr)
	} else {
		grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
		if pod.TerminationGracePeriodSeconds != nil {
			grace = *pod.TerminationGracePeriodSeconds
		}
		if time.Duration(grace)*time.Second < drain+shutdownExtra {
			c.errorf("%s: terminationGracePeriodSeconds %d is shorter than --drain-timeout %v plus %v: the kubelet would kill pgfence while it drains", where, grace, drain, shutdownExtra)
		}
	}

	// Scraping.
	ann := w.template.Annotations
	if ann["prometheus.io/scrape"] != "true" {
		c.errorf("%v: the pod template has no prometheus.io/scrape: \"true\" annotation for pgfence's /metrics", w)
	} else if err == nil && ann["prometheus.io/port"] != strconv.Itoa(int(metricsPort)) {
		c.errorf("%v: prometheus.io/port %q is not pgfence's metrics port %d", w, ann["prometheus.io/port"], metricsPort)
	}
}

// environment is a container's environment as the kubelet builds it:
// envFrom in order (later sources win), then env (which wins). Values
// from Secrets and the downward API are placeholders.
func (c *checker) environment(ct *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, ef := range ct.EnvFrom {
		if ef.ConfigMapRef != nil {
			if cm := c.configMaps[ef.ConfigMapRef.Name]; cm != nil {
				for k, v := range cm.Data {
					env[ef.Prefix+k] = v
				}
			}
		}
		if ef.SecretRef != nil {
			if s := c.secrets[ef.SecretRef.Name]; s != nil {
				for k := range s.StringData {
					env[ef.Prefix+k] = "(secret)"
				}
				for k := range s.Data {
					env[ef.Prefix+k] = "(secret)"
				}
			}
		}
	}
	for _, e := range ct.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.ConfigMapKeyRef != nil:
			if cm := c.configMaps[e.ValueFrom.ConfigMapKeyRef.Name]; cm != nil {
				env[e.Name] = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
			}
		default:
			env[e.Name] = "(" + e.Name + " from elsewhere)"
		}
	}
	return env
}

func hasSecretEnv(ct *corev1.Container, name string) bool {
	for _, e := range ct.Env {
		if e.Name == name && e.Value == "" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return true
		}
	}
	return false
}

func (c *checker) checkService(o object, s *corev1.Service, ws []workload) {
	if len(s.Spec.Selector) == 0 {
		c.errorf("%v: no selector", o)
		return
	}
	sel := labels.SelectorFromSet(s.Spec.Selector)
	var pods []workload
	for _, w := range ws {
		if sel.Matches(labels.Set(w.template.Labels)) {
			pods = append(pods, w)
		}
	}
	if len(pods) == 0 {
		c.errorf("%v: selector %v selects no pod template here", o, sel)
		return
	}
	for _, p := range s.Spec.Ports {
		if p.Name == "" {
			c.errorf("%v: port %d has no name", o, p.Port)
		}
		target := p.TargetPort
		if target.Type == intstr.Int && target.IntVal == 0 {
			target = intstr.FromInt32(p.Port)
		}
		found := false
		for _, w := range pods {
			all := append(slices.Clone(w.template.Spec.InitContainers), w.template.Spec.Containers...)
			for i := range all {
				for _, cp := range all[i].Ports {
					if (target.Type == intstr.String && cp.Name == target.StrVal) ||
						(target.Type == intstr.Int && cp.ContainerPort == target.IntVal) {
						found = found || protocolOf(cp.Protocol) == protocolOf(p.Protocol)
					}
				}
			}
		}
		if !found {
			c.errorf("%v: port %s: targetPort %s is no container port of the pods it selects", o, p.Name, target.String())
		}
	}
}

func protocolOf(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

func probes(ct *corev1.Container) map[string]*corev1.Probe {
	return map[string]*corev1.Probe{"readiness": ct.ReadinessProbe, "liveness": ct.LivenessProbe, "startup": ct.StartupProbe}
}

func probePort(p *corev1.Probe) (intstr.IntOrString, bool) {
	switch {
	case p.HTTPGet != nil:
		return p.HTTPGet.Port, true
	case p.TCPSocket != nil:
		return p.TCPSocket.Port, true
	}
	return intstr.IntOrString{}, false
}

func namedPort(ct *corev1.Container, name string) (corev1.ContainerPort, bool) {
	for _, p := range ct.Ports {
		if p.Name == name {
			return p, true
		}
	}
	return corev1.ContainerPort{}, false
}

func timeout(p *corev1.Probe) int32 {
	if p.TimeoutSeconds == 0 {
		return 1 // the API's default
	}
	return p.TimeoutSeconds
}

// splitListen reads a listen address: its port, and whether it is
// loopback only.
func splitListen(addr string) (int32, bool, error) {
	if addr == "" {
		return 0, false, errors.New("disabled")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, false, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0, false, fmt.Errorf("port %q: %v", port, err)
	}
	loopback := host == "localhost"
	if ip := net.ParseIP(host); ip != nil {
		loopback = ip.IsLoopback()
	}
	return int32(n), loopback, nil
}

// isPgfence says whether an image is pgfence's (its repository's last
// element is "pgfence").
func isPgfence(image string) bool {
	repo, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return repo[strings.LastIndex(repo, "/")+1:] == "pgfence"
}

// fullyQualified says whether an image names its registry and a tag
// other than latest (or a digest).
func fullyQualified(image string) bool {
	repo, digest, hasDigest := strings.Cut(image, "@")
	first, _, hasSlash := strings.Cut(repo, "/")
	if !hasSlash || !strings.ContainsAny(first, ".:") || strings.HasPrefix(first, "localhost") {
		return false
	}
	if hasDigest {
		return digest != ""
	}
	i := strings.LastIndex(repo, ":")
	if i <= strings.LastIndex(repo, "/") {
		return false // no tag: latest
	}
	return repo[i+1:] != "latest"
}

// parseGoMemLimit reads GOMEMLIMIT's syntax: bytes, with an optional
// B, KiB, MiB, GiB or TiB suffix.
func parseGoMemLimit(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errors.New("want a number of bytes with an optional B, KiB, MiB, GiB or TiB suffix")
	}
	return n * mult, nil
}

func isTrue(b *bool) bool { return b != nil && *b }

func firstBool(bs ...*bool) bool {
	for _, b := range bs {
		if b != nil {
			return *b
		}
	}
	return false
}

func firstInt(is ...*int64) *int64 {
	for _, i := range is {
		if i != nil {
			return i
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestManifests decodes and checks the manifests of this directory.
func TestManifests(t *testing.T) {
	files := readDir(t, ".")
	for _, f := range wantFiles {
		if _, ok := files[f]; !ok {
			t.Errorf("%s is missing", f)
		}
	}
	objs, problems := decode(files)
	problems = append(problems, check(objs, flags)...)
	for _, p := range problems {
		t.Error(p)
	}
	// Every topology runs pgfence: a check that found no pgfence container
	// would pass vacuously.
	perFile := map[string]int{}
	for _, w := range workloads(objs) {
		for _, ct := range append(slices.Clone(w.template.Spec.InitContainers), w.template.Spec.Containers...) {
			if isPgfence(ct.Image) {
				perFile[w.file]++
			}
		}
	}
	for _, f := range wantFiles[:2] {
		if perFile[f] == 0 {
			t.Errorf("%s: no pgfence container found", f)
		}
	}
	t.Logf("%d objects in %d files; %d serve flags known", len(objs), len(files), len(flags.names))
}

// TestChecksFail breaks the manifests, one mistake at a time, and wants
// the checks to find each: a check that cannot fail checks nothing.
func TestChecksFail(t *testing.T) {
	files := readDir(t, ".")
	const (
		sidecar    = "pgfence-sidecar-app.yaml"
		beside     = "pgfence-beside-postgres.yaml"
		secrets    = "example-secret.yaml"
		podMonitor = "pgfence-podmonitor.yaml"
	)
	cases := []struct {
		name, file, old, new, want string
	}{
		{"misspelled field", sidecar, "readinessProbe:", "readinesProbe:", `unknown field "spec.template.spec.initContainers[0].readinesProbe"`},
		{"field in the wrong case", beside, "livenessProbe:", "LivenessProbe:", `unknown field`},
		{"field in the wrong place", sidecar, "      terminationGracePeriodSeconds: 60", "      terminationGracePeriodSecond: 60", `unknown field`},
		{"duplicate field", sidecar, "      terminationGracePeriodSeconds: 60\n", "      terminationGracePeriodSeconds: 60\n      terminationGracePeriodSeconds: 30\n", `already set in map`},
		{"wrong type", sidecar, "replicas: 2", "replicas: two", `cannot unmarshal`},
		{"unknown kind", beside, "kind: StatefulSet", "kind: StatefulSett", `unknown kind "StatefulSett"`},
		{"unknown apiVersion", sidecar, "apiVersion: apps/v1", "apiVersion: apps/v1beta1", `unknown kind "Deployment"`},
		{"unknown flag in args", sidecar, `args: ["serve"]`, `args: ["serve", "--shutdown-timeout=30s"]`, `--shutdown-timeout is not a flag`},
		{"unknown flag with a value", beside, `args: ["serve"]`, `args: ["serve", "--guard", "accounts", "--token", "fence.token"]`, `--token is not a flag`},
		{"short flag", beside, `args: ["serve"]`, `args: ["serve", "-g", "accounts"]`, `"-g" is not a --flag`},
		{"no serve", sidecar, `args: ["serve"]`, `args: ["--guard=accounts"]`, `args must start with "serve"`},
		{"unknown PGFENCE_ variable", sidecar, "PGFENCE_DRAIN_TIMEOUT:", "PGFENCE_SHUTDOWN_TIMEOUT:", `PGFENCE_SHUTDOWN_TIMEOUT sets --shutdown-timeout`},
		{"unknown PGFENCE_ env", beside, "            - name: GOMEMLIMIT", "            - name: PGFENCE_TOKEN\n              value: fence.token\n            - name: GOMEMLIMIT", `env PGFENCE_TOKEN sets --token`},
		{"readiness on /healthz", sidecar, "path: /readyz", "path: /healthz", `readiness probe: path "/healthz", want /readyz`},
		{"no readiness probe", beside, "          readinessProbe:\n            httpGet:\n              path: /readyz\n              port: metrics\n            periodSeconds: 5\n            timeoutSeconds: 9\n            failureThreshold: 3\n", "", `no readiness probe`},
		{"probe on a port that is not there", sidecar, "              path: /readyz\n              port: metrics", "              path: /readyz\n              port: metric", `no port named "metric"`},
		{"probe on a number", beside, "              path: /healthz\n              port: metrics", "              path: /healthz\n              port: 16432", `use the container port's name`},
		{"postgres probe on a port that is not there", beside, "            exec:\n              command: [\"pg_isready\", \"-q\", \"-h\", \"127.0.0.1\", \"-p\", \"5432\"]", "            tcpSocket:\n              port: postgres", `no port named "postgres"`},
		{"liveness that fails while Postgres is down", sidecar, "            periodSeconds: 10\n            timeoutSeconds: 7", "            periodSeconds: 10\n            timeoutSeconds: 3", `liveness probe: timeoutSeconds 3`},
		{"metrics on loopback", sidecar, `PGFENCE_METRICS_LISTEN: ":16432"`, `PGFENCE_METRICS_LISTEN: "127.0.0.1:16432"`, `is a loopback address`},
		{"metrics on the default", beside, "  PGFENCE_METRICS_LISTEN: \":16432\"\n", "", `--metrics-listen "127.0.0.1:16432" is a loopback address`},
		{"metrics port moved", beside, `PGFENCE_METRICS_LISTEN: ":16432"`, `PGFENCE_METRICS_LISTEN: ":16433"`, `port metrics (16432) is neither`},
		{"declared port on loopback", beside, `PGFENCE_LISTEN: ":6432"`, `PGFENCE_LISTEN: "127.0.0.1:6432"`, `is loopback-only`},
		{"no limits", sidecar, "            limits:\n              cpu: \"1\"\n              memory: 256Mi\n          securityContext:\n            # The image runs", "          securityContext:\n            # The image runs", `no resources.limits.memory`},
		{"request above limit", beside, "              cpu: 250m", "              cpu: \"3\"", `resources.requests.cpu 3 is above the limit 2`},
		{"GOMEMLIMIT over the limit", sidecar, `value: "200MiB"`, `value: "300MiB"`, `GOMEMLIMIT "300MiB" is not below`},
		{"runAsNonRoot false", sidecar, "            runAsUser: 10001\n            runAsGroup: 10001\n            runAsNonRoot: true", "            runAsUser: 10001\n            runAsGroup: 10001\n            runAsNonRoot: false", `runAsNonRoot is not true`},
		{"no runAsUser", beside, "            runAsUser: 10001\n", "", `no non-zero runAsUser`},
		{"writable root", beside, "            runAsNonRoot: true\n            readOnlyRootFilesystem: true\n            allowPrivilegeEscalation: false\n            capabilities:\n              drop: [\"ALL\"]\n            seccompProfile:\n              type: RuntimeDefault\n      volumes:", "            runAsNonRoot: true\n            readOnlyRootFilesystem: false\n            allowPrivilegeEscalation: false\n            capabilities:\n              drop: [\"ALL\"]\n            seccompProfile:\n              type: RuntimeDefault\n      volumes:", `readOnlyRootFilesystem is not true`},
		{"privilege escalation", sidecar, "            allowPrivilegeEscalation: false", "            allowPrivilegeEscalation: true", `allowPrivilegeEscalation is not false`},
		{"capabilities kept", sidecar, `drop: ["ALL"]`, `drop: ["NET_RAW"]`, `capabilities must drop ALL`},
		{"seccomp unconfined", sidecar, "type: RuntimeDefault", "type: Unconfined", `seccompProfile is not RuntimeDefault`},
		{"password in the URL", sidecar, "postgres://pgfence@", "postgres://pgfence:hunter2@", `password`},
		{"password as a keyword", beside, `"postgres://postgres@127.0.0.1:5432/appdb?sslmode=disable"`, `"host=127.0.0.1 user=postgres password=hunter2 dbname=appdb"`, `holds a password`},
		{"password as a literal env", sidecar, "            - name: PGPASSWORD\n              valueFrom:\n                secretKeyRef:\n                  name: pgfence-upstream\n                  key: password", "            - name: PGPASSWORD\n              value: hunter2", `env PGPASSWORD holds a password as a literal value`},
		{"password in args", beside, `args: ["serve"]`, `args: ["serve", "--upstream=postgres://postgres:hunter2@127.0.0.1/appdb"]`, `a password in command or args`},
		{"password in a ConfigMap", sidecar, "  PGFENCE_LOG_FORMAT: \"json\"", "  PGFENCE_LOG_FORMAT: \"json\"\n  PGPASSWORD: hunter2", `PGPASSWORD holds a password`},
		{"password in the app's URL", sidecar, "postgres://billing@127.0.0.1", "postgres://billing:hunter2@127.0.0.1", `env DATABASE_URL holds a password`},
		{"Secret reference to no key", beside, "                  name: postgres-superuser\n                  key: password", "                  name: postgres-superuser\n                  key: passwd", `has no key "passwd"`},
		{"Secret reference to no Secret", sidecar, "name: billing-worker-db", "name: billing-db", `no Secret "billing-db"`},
		{"ConfigMap that is not there", sidecar, "                name: pgfence-sidecar\n", "                name: pgfence-sidecars\n", `no ConfigMap "pgfence-sidecars"`},
		{"example Secret not marked", secrets, "    pgfence/example: \"true\"\n", "", `must be an example`},
		{"Secret in a topology file", beside, "---\napiVersion: apps/v1\nkind: StatefulSet", "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: x\n  annotations:\n    pgfence/example: \"true\"\nstringData:\n  password: x\n---\napiVersion: apps/v1\nkind: StatefulSet", `must not define Secrets`},
		{"init container that never exits", sidecar, "          restartPolicy: Always\n", "", `needs restartPolicy: Always`},
		{"grace shorter than the drain", beside, "terminationGracePeriodSeconds: 90", "terminationGracePeriodSeconds: 20", `terminationGracePeriodSeconds 20 is shorter than --drain-timeout 30s`},
		{"default grace", beside, "      terminationGracePeriodSeconds: 90\n", "", `terminationGracePeriodSeconds 30 is shorter than --drain-timeout 30s`},
		{"bad drain", sidecar, `PGFENCE_DRAIN_TIMEOUT: "20s"`, `PGFENCE_DRAIN_TIMEOUT: "20"`, `--drain-timeout "20"`},
		{"token setting without a dot", sidecar, `PGFENCE_TOKEN_SETTING: "fence.token"`, `PGFENCE_TOKEN_SETTING: "fence_token"`, `must contain a dot`},
		{"no upstream", sidecar, "  PGFENCE_UPSTREAM: ", "  UPSTREAM: ", `no --upstream`},
		{"no PGPASSWORD", beside, "            - name: PGPASSWORD\n              valueFrom:\n                secretKeyRef:\n                  name: postgres-superuser\n                  key: password\n            # A soft", "            # A soft", `no PGPASSWORD from valueFrom.secretKeyRef`},
		{"image latest", sidecar, "image: registry.example.com/pgfence/pgfence:0.1.0", "image: registry.example.com/pgfence/pgfence:latest", `fully qualified`},
		{"image short name", beside, "image: docker.io/library/postgres:15", "image: postgres:15", `image "postgres:15"`},
		{"no scrape annotation", beside, "        prometheus.io/scrape: \"true\"\n", "", `no prometheus.io/scrape`},
		{"scrape port annotation wrong", sidecar, `prometheus.io/port: "16432"`, `prometheus.io/port: "6432"`, `prometheus.io/port "6432" is not pgfence's metrics port 16432`},
		{"selector not matching the template", sidecar, "    matchLabels:\n      app.kubernetes.io/name: billing-worker", "    matchLabels:\n      app.kubernetes.io/name: billing", `does not select the pod template's labels`},
		{"Service selecting nothing", beside, "  type: ClusterIP\n  selector:\n    app.kubernetes.io/name: appdb", "  type: ClusterIP\n  selector:\n    app.kubernetes.io/name: app-db", `selects no pod template here`},
		{"Service targeting a port that is not there", beside, "targetPort: metrics", "targetPort: metricz", `targetPort metricz is no container port`},
		{"Service targeting a port number that is not there", beside, "targetPort: pgfence", "targetPort: 5432", `targetPort 5432 is no container port`},
		{"Service port without a name", beside, "    - name: metrics\n      port: 16432", "    - port: 16432", `port 16432 has no name`},
		{"governing Service not headless", beside, "  clusterIP: None\n", "", `must be headless`},
		{"governing Service missing", beside, "serviceName: appdb-headless", "serviceName: appdb-governing", `no such Service`},
		{"defined twice", beside, "  name: pgfence-appdb\n", "  name: pgfence-sidecar\n", `defined again`},
		// NetworkPolicies: only the application reaches pgfence's port, only
		// the monitoring namespace its metrics.
		{"no NetworkPolicy", sidecar, "kind: NetworkPolicy", "kind: NetworkPolicyy", `no NetworkPolicy (with policyTypes Ingress) selects its pods`},
		{"NetworkPolicy for Egress only", beside, `policyTypes: ["Ingress"]`, `policyTypes: ["Egress"]`, `policyTypes lacks Ingress`},
		{"NetworkPolicy selecting nothing", beside, "spec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: appdb", "spec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: app-db", `podSelector selects no pod template here`},
		{"metrics open to every namespace", sidecar, "            matchLabels:\n              kubernetes.io/metadata.name: monitoring", "            matchLabels: {}", `is open to more than the namespace "monitoring"`},
		{"metrics open to addresses", beside, "    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring", "    - from:\n        - ipBlock:\n            cidr: 0.0.0.0/0", `is open to more than the namespace "monitoring"`},
		{"pgfence's port open to a whole namespace", beside, "              kubernetes.io/metadata.name: billing\n          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: billing-worker\n", "              kubernetes.io/metadata.name: billing\n", `pgfence's port (pgfence) is open to more than the application`},
		{"rule without sources", beside, "    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: billing\n          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: billing-worker\n      ports:", "    - ports:", `no from: it lets every source in`},
		{"rule without ports", sidecar, "      ports:\n        - port: metrics\n          protocol: TCP\n", "", `no ports: it opens every port`},
		{"rule on a port that is not there", beside, "        - port: pgfence\n", "        - port: pgfencex\n", `port pgfencex is no container port`},
		{"application shut out", beside, "    # Clients: the application's pods, on pgfence's port.\n    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: billing\n          podSelector:\n            matchLabels:\n              app.kubernetes.io/name: billing-worker\n      ports:\n        - port: pgfence\n          protocol: TCP\n", "", `no NetworkPolicy rule lets the application reach pgfence's port 6432`},
		{"Prometheus shut out", sidecar, "    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n      ports:\n        - port: metrics\n          protocol: TCP\n", "    []\n", `no NetworkPolicy rule lets the namespace "monitoring" reach pgfence's metrics port 16432`},
		// The StatefulSet's PodDisruptionBudget.
		{"no PodDisruptionBudget", beside, "kind: PodDisruptionBudget", "kind: PodDisruptionBudgett", `no PodDisruptionBudget selects its pods`},
		{"PodDisruptionBudget without a budget", beside, "  maxUnavailable: 0\n", "", `neither minAvailable nor maxUnavailable`},
		{"PodDisruptionBudget selecting nothing", beside, "  unhealthyPodEvictionPolicy: AlwaysAllow\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: appdb", "  unhealthyPodEvictionPolicy: AlwaysAllow\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: app-db", `selector selects no pod template here`},
		// The PodMonitor.
		{"PodMonitor misspelled field", podMonitor, "podMetricsEndpoints:", "podMetricEndpoints:", `unknown field "spec.podMetricEndpoints"`},
		{"PodMonitor on the client port", podMonitor, "    - port: metrics", "    - port: pgfence", `port "pgfence" of pgfence-beside-postgres.yaml: StatefulSet appdb is 6432, not pgfence's metrics port 16432`},
		{"PodMonitor on no port", podMonitor, "    - port: metrics\n", "    - scheme: http\n", `no port name`},
		{"PodMonitor on another path", podMonitor, "      path: /metrics", "      path: /healthz", `path "/healthz", want /metrics`},
		{"PodMonitor in its own namespace only", podMonitor, "  namespaceSelector:\n    any: true\n", "", `it selects only pods of its own namespace`},
		{"PodMonitor selecting nothing", podMonitor, `pgfence/scrape: "true"`, `pgfence/scrape: "yes"`, `selector selects no pod template here`},
		{"pod left unscraped", sidecar, "        pgfence/scrape: \"true\"\n", "", `Deployment billing-worker: no PodMonitor scrapes its pgfence`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			text := string(files[tc.file])
			if !strings.Contains(text, tc.old) {
				t.Fatalf("%s no longer contains %q: update this case", tc.file, tc.old)
			}
			broken := map[string][]byte{}
			for k, v := range files {
				broken[k] = v
			}
			// Every occurrence: a setting given at two levels (the pod's
			// and the container's security context) breaks at both.
			broken[tc.file] = []byte(strings.ReplaceAll(text, tc.old, tc.new))
			objs, problems := decode(broken)
			problems = append(problems, check(objs, flags)...)
			for _, p := range problems {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Errorf("no problem found containing %q; found:\n  %s", tc.want, strings.Join(problems, "\n  "))
		})
	}
}

// TestParseHelp reads cobra's flag lines, bool flags and defaults.
func TestParseHelp(t *testing.T) {
	help := `Flags:
      --allow-truncate                     let TRUNCATE through
      --drain-timeout duration             on SIGTERM, how long (default 30s)
      --guard stringArray                  guarded table
  -h, --help                               help for serve
      --listen string                      address clients connect to (default "127.0.0.1:6432")
      --metrics-listen string              address of /metrics ("" to disable) (default "127.0.0.1:16432")
      --token-setting string               session setting (default "fence.token")
      --upstream string                    postgres:// URL
`
	f, err := parseHelp(help)
	if err != nil {
		t.Fatal(err)
	}
	if f.names["help"] || !f.isBool["allow-truncate"] || f.isBool["guard"] ||
		f.defaults["metrics-listen"] != "127.0.0.1:16432" || f.defaults["drain-timeout"] != "30s" || f.defaults["token-setting"] != "fence.token" {
		t.Fatalf("parsed %+v", f)
	}
	if _, err := parseHelp("Usage:\n  pgfence serve [flags]\n"); err == nil {
		t.Fatal("a help without flags parsed")
	}
}
