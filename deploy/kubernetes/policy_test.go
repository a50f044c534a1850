package kubernetes

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)

// The checks of what stands around the workloads: NetworkPolicies (only
// the application reaches pgfence's port, only the monitoring namespace
// its metrics), PodDisruptionBudgets (a StatefulSet's), PodMonitors (every
// pgfence scraped, on its metrics port).

// monitoringNamespace is the namespace whose Prometheus may reach
// pgfence's metrics port.
const monitoringNamespace = "monitoring"

// pgfencePorts is where a workload's pgfence listens, as its settings say
// (checkPgfence reports settings it cannot read).
type pgfencePorts struct {
	container      *corev1.Container
	client         int32 // --listen's port; 0 when loopback-only or unreadable
	metrics        int32 // --metrics-listen's; 0 when unreadable
	metricsPortRef string
}

// pgfenceIn finds the workload's pgfence container and its ports.
func (c *checker) pgfenceIn(w workload) (pgfencePorts, bool) {
	for _, ct := range append(slices.Clone(w.template.Spec.InitContainers), w.template.Spec.Containers...) {
		if !isPgfence(ct.Image) {
			continue
		}
		p := pgfencePorts{container: &ct}
		setting := c.settings(&ct)
		if port, loopback, err := splitListen(setting("listen")); err == nil && !loopback {
			p.client = port
		}
		if port, _, err := splitListen(setting("metrics-listen")); err == nil {
			p.metrics = port
		}
		for _, cp := range ct.Ports {
			if cp.ContainerPort == p.metrics {
				p.metricsPortRef = cp.Name
			}
		}
		return p, true
	}
	return pgfencePorts{}, false
}

// settings resolves a pgfence container's flags as pgfence would: its
// args, else its environment, else the default.
func (c *checker) settings(ct *corev1.Container) func(string) string {
	cli := map[string]string{}
	for i := 1; i < len(ct.Args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimPrefix(ct.Args[i], "--"), "=")
		if !hasVal && !c.flags.isBool[name] && i+1 < len(ct.Args) {
			i++
			val = ct.Args[i]
		}
		cli[name] = val
	}
	env := c.environment(ct)
	return func(flag string) string {
		if v, ok := cli[flag]; ok {
			return v
		}
		if v, ok := env["PGFENCE_"+strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))]; ok {
			return v
		}
		return c.flags.defaults[flag]
	}
}

// selects lists the workloads a label selector selects.
func selects(sel *metav1.LabelSelector, ws []workload) ([]workload, error) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, err
	}
	var out []workload
	for _, w := range ws {
		if !s.Empty() && s.Matches(labels.Set(w.template.Labels)) {
			out = append(out, w)
		}
	}
	return out, nil
}

// portOf resolves a port a NetworkPolicy or PodMonitor names (by number
// or by name) among a pod template's container ports.
func portOf(w workload, port intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, ct := range append(slices.Clone(w.template.Spec.InitContainers), w.template.Spec.Containers...) {
		for _, cp := range ct.Ports {
			if port.Type == intstr.String && cp.Name == port.StrVal || port.Type == intstr.Int && cp.ContainerPort == port.IntVal {
				return cp, true
			}
		}
	}
	return corev1.ContainerPort{}, false
}

// onlyMonitoring reports whether a peer is (a subset of) the monitoring
// namespace.
func onlyMonitoring(p networkingv1.NetworkPolicyPeer) bool {
	return p.IPBlock == nil && p.NamespaceSelector != nil && len(p.NamespaceSelector.MatchExpressions) == 0 &&
		len(p.NamespaceSelector.MatchLabels) == 1 && p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == monitoringNamespace
}

// onlyPods reports whether a peer is some pods (the application's), not a
// whole namespace, every pod, or addresses.
func onlyPods(p networkingv1.NetworkPolicyPeer) bool {
	return p.IPBlock == nil && p.PodSelector != nil && (len(p.PodSelector.MatchLabels) > 0 || len(p.PodSelector.MatchExpressions) > 0)
}

func (c *checker) checkNetworkPolicies(objs []object, ws []workload) {
	covered := map[string]bool{}   // workloads an Ingress policy selects
	clientsIn := map[string]bool{} // workloads whose pgfence port some pods may reach
	scrapedBy := map[string]bool{} // workloads whose metrics port the monitoring namespace may reach
	for _, o := range objs {
		np, ok := o.obj.(*networkingv1.NetworkPolicy)
		if !ok {
			continue
		}
		selected, err := selects(&np.Spec.PodSelector, ws)
		switch {
		case err != nil:
			c.errorf("%v: podSelector: %v", o, err)
			continue
		case len(selected) == 0:
			c.errorf("%v: podSelector selects no pod template here", o)
			continue
		}
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			c.errorf("%v: policyTypes lacks Ingress: it restricts nothing that reaches pgfence", o)
			continue
		}
		for _, w := range selected {
			covered[w.String()] = true
		}
		for k, rule := range np.Spec.Ingress {
			where := fmt.Sprintf("%v: ingress rule %d", o, k+1)
			if len(rule.From) == 0 {
				c.errorf("%s: no from: it lets every source in", where)
			}
			if len(rule.Ports) == 0 {
				c.errorf("%s: no ports: it opens every port", where)
			}
			for _, rp := range rule.Ports {
				if rp.Port == nil {
					c.errorf("%s: a port without a number or name opens every port", where)
					continue
				}
				for _, w := range selected {
					cp, found := portOf(w, *rp.Port)
					if !found {
						c.errorf("%s: port %s is no container port of %v", where, rp.Port.String(), w)
						continue
					}
					pf, ok := c.pgfenceIn(w)
					if !ok {
						continue
					}
					switch cp.ContainerPort {
					case pf.metrics:
						for _, peer := range rule.From {
							if !onlyMonitoring(peer) {
								c.errorf("%s: pgfence's metrics port (%s) is open to more than the namespace %q: a from entry must be namespaceSelector matchLabels kubernetes.io/metadata.name: %s", where, rp.Port.String(), monitoringNamespace, monitoringNamespace)
							}
						}
						scrapedBy[w.String()] = len(rule.From) > 0
					case pf.client:
						for _, peer := range rule.From {
							if !onlyPods(peer) {
								c.errorf("%s: pgfence's port (%s) is open to more than the application: each from entry needs a podSelector that names its pods (and no ipBlock)", where, rp.Port.String())
							}
						}
						clientsIn[w.String()] = len(rule.From) > 0
					}
				}
			}
		}
	}
	for _, w := range ws {
		pf, ok := c.pgfenceIn(w)
		if !ok {
			continue
		}
		switch {
		case !covered[w.String()]:
			c.errorf("%v: no NetworkPolicy (with policyTypes Ingress) selects its pods: every pod in the cluster may reach pgfence", w)
		case pf.client != 0 && !clientsIn[w.String()]:
			c.errorf("%v: no NetworkPolicy rule lets the application reach pgfence's port %d", w, pf.client)
		case pf.metrics != 0 && !scrapedBy[w.String()]:
			c.errorf("%v: no NetworkPolicy rule lets the namespace %q reach pgfence's metrics port %d", w, monitoringNamespace, pf.metrics)
		}
	}
}

func (c *checker) checkDisruptionBudgets(objs []object, ws []workload) {
	budgeted := map[string]bool{}
	for _, o := range objs {
		pdb, ok := o.obj.(*policyv1.PodDisruptionBudget)
		if !ok {
			continue
		}
		if pdb.Spec.Selector == nil {
			c.errorf("%v: no selector", o)
			continue
		}
		selected, err := selects(pdb.Spec.Selector, ws)
		switch {
		case err != nil:
			c.errorf("%v: selector: %v", o, err)
		case len(selected) == 0:
			c.errorf("%v: selector selects no pod template here", o)
		}
		if pdb.Spec.MinAvailable == nil && pdb.Spec.MaxUnavailable == nil {
			c.errorf("%v: neither minAvailable nor maxUnavailable: it budgets nothing", o)
			continue
		}
		for _, w := range selected {
			budgeted[w.String()] = true
		}
	}
	for _, w := range ws {
		if _, ok := w.obj.(*appsv1.StatefulSet); !ok {
			continue
		}
		if _, ok := c.pgfenceIn(w); ok && !budgeted[w.String()] {
			c.errorf("%v: no PodDisruptionBudget selects its pods: a node drain evicts the database every writer goes through at any moment", w)
		}
	}
}

func (c *checker) checkPodMonitors(objs []object, ws []workload) {
	scraped := map[string]bool{}
	for _, o := range objs {
		pm, ok := o.obj.(*monitoringv1.PodMonitor)
		if !ok {
			continue
		}
		selected, err := selects(&pm.Spec.Selector, ws)
		switch {
		case err != nil:
			c.errorf("%v: selector: %v", o, err)
			continue
		case len(selected) == 0:
			c.errorf("%v: selector selects no pod template here", o)
			continue
		}
		if !pm.Spec.NamespaceSelector.Any && len(pm.Spec.NamespaceSelector.MatchNames) == 0 {
			c.errorf("%v: namespaceSelector: it selects only pods of its own namespace (monitoring), where pgfence does not run; use any: true or matchNames", o)
		}
		if len(pm.Spec.PodMetricsEndpoints) == 0 {
			c.errorf("%v: no podMetricsEndpoints", o)
		}
		for k, ep := range pm.Spec.PodMetricsEndpoints {
			where := fmt.Sprintf("%v: podMetricsEndpoints[%d]", o, k)
			if ep.Path != "" && ep.Path != "/metrics" {
				c.errorf("%s: path %q, want /metrics", where, ep.Path)
			}
			if ep.Port == nil || *ep.Port == "" {
				c.errorf("%s: no port name: name pgfence's metrics port", where)
				continue
			}
			for _, w := range selected {
				pf, ok := c.pgfenceIn(w)
				if !ok {
					continue
				}
				cp, found := portOf(w, intstr.FromString(*ep.Port))
				switch {
				case !found:
					c.errorf("%s: port %q is no container port of %v", where, *ep.Port, w)
				case cp.ContainerPort != pf.metrics:
					c.errorf("%s: port %q of %v is %d, not pgfence's metrics port %d", where, *ep.Port, w, cp.ContainerPort, pf.metrics)
				default:
					scraped[w.String()] = true
				}
			}
		}
	}
	for _, w := range ws {
		if _, ok := c.pgfenceIn(w); ok && !scraped[w.String()] {
			c.errorf("%v: no PodMonitor scrapes its pgfence (pgfence-podmonitor.yaml selects pods labelled pgfence/scrape: \"true\")", w)
		}
	}
}
