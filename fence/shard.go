package fence

import (
	"github.com/pgfence/pgfence/internal/loopstat"
	"github.com/pgfence/pgfence/proxy"
)

// Per-loop state: a session's statements all run on its event loop (see
// proxy.Client.Loop), and what they count and cache goes to that loop's
// shard, so that loops on other cores never write one cache line or take
// one lock (see internal/loopstat, and state.shard for the caches).

// shardOf is c's shard.
func shardOf(c *proxy.Client) int { return loopstat.Shard(c.Loop(), c.ID) }

// seriesKind says which vector a session's event counter is of.
type seriesKind uint8

const (
	rejectsSeries seriesKind = iota
	withoutTokenSeries
	unfencedSeries
)

// seriesKey names an event counter: its vector and up to four label
// values after the database ("" past the vector's last).
type seriesKey struct {
	kind       seriesKind
	a, b, c, d string
}

// seriesCache holds the series of events a session's side resolved
// under the configuration st.
type seriesCache struct {
	st       *state
	counters map[seriesKey]*loopstat.Counter
	gaps     map[[2]string]*loopstat.Histogram
}

// of returns the cache of the session's side that counts events of kind:
// unfenced writes are counted as they are planned, by the client side;
// the others from the server's replies, by the server side (with the
// goroutine relay, two goroutines). A reload (another state) starts it
// over, as it may retire series.
func (p *Policy) seriesOf(c *proxy.Client, kind seriesKind) *seriesCache {
	sess := sessionOf(c)
	sc := &sess.serverSeries
	if kind == unfencedSeries {
		sc = &sess.clientSeries
	}
	if st := p.state.Load(); sc.st != st {
		*sc = seriesCache{st: st}
	}
	return sc
}

// counter returns the counter of an event whose labels only the event
// says (a backstop notice's table, a refused write's): the session keeps
// those it resolved, as a lookup in the vector takes its lock, which a
// session then takes once per series rather than once per event.
func (p *Policy) counter(c *proxy.Client, kind seriesKind, a, b, cc, d string) *loopstat.Counter {
	sc := p.seriesOf(c, kind)
	k := seriesKey{kind, a, b, cc, d}
	if x := sc.counters[k]; x != nil {
		return x
	}
	var x *loopstat.Counter
	switch kind {
	case rejectsSeries:
		x = p.m.rejects.With(a, b, cc, d)
	case withoutTokenSeries:
		x = p.m.withoutToken.With(a, b, cc)
	case unfencedSeries:
		x = p.m.unfenced.With(a, b)
	}
	if sc.counters == nil {
		sc.counters = map[seriesKey]*loopstat.Counter{}
	}
	sc.counters[k] = x
	return x
}

// gap is counter for the token-gap histogram of table and kind, which
// the server side observes.
func (p *Policy) gap(c *proxy.Client, table, kind string) *loopstat.Histogram {
	sc := p.seriesOf(c, rejectsSeries)
	k := [2]string{table, kind}
	if h := sc.gaps[k]; h != nil {
		return h
	}
	h := p.m.tokenGap.With(table, kind)
	if sc.gaps == nil {
		sc.gaps = map[[2]string]*loopstat.Histogram{}
	}
	sc.gaps[k] = h
	return h
}
