package pgtest

import (
	"testing"

	"github.com/pgfence/pgfence/proxy"
)

// StartRelay starts a proxy in front of the package's Postgres with no
// fencing policy: its Interceptor is proxy.NopInterceptor, which passes
// every message as sent, unless edit sets another. It is for the proxy's
// own tests of the relay (startup, cancel, COPY, pipelines, faults, TLS),
// which then prove the relay alone; fencing, and what the relay does for
// it (answered settings, holds, probes), is tested through StartProxy.
// Its Policy and Registry are nil. It stops when the test ends.
func StartRelay(t testing.TB, edit ...func(*proxy.Config)) *Proxy {
	t.Helper()
	need(t)
	px, pcfg, _ := newProxy()
	pcfg.Interceptor = proxy.NopInterceptor{}
	for _, e := range edit {
		e(&pcfg)
	}
	px.configured(&pcfg)
	srv, err := proxy.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	px.serve(t, srv)
	return px
}
