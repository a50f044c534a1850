package fence

import (
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/pgfence/pgfence/internal/loopstat"
	"github.com/pgfence/pgfence/proxy"
	"github.com/pgfence/pgfence/sqlrewrite"
)

// Config is the fencing policy.
type Config struct {
	// Guards are the guarded tables, each with its rollout and missing-token
	// policy.
	Guards       []sqlrewrite.Guard
	TokenSetting string // default "fence.token"
	// Allow lets unfenceable forms through instead of refusing them.
	Allow sqlrewrite.Allow
	// NotifyStale sends a stale writer a WARNING naming the table and token
	// after its statement, besides counting it.
	NotifyStale bool
	// StaleLogInterval is the least time between two log lines of stale
	// writes of one table, kind, path and rollout (see staleLog); 0 logs
	// every stale write.
	StaleLogInterval time.Duration
	// CacheSize is how many distinct statement texts keep their rewrite,
	// and again how many templates of parameterized writes and how many
	// whole texts of those, in the caches of each event loop (see Per-loop
	// state in the package documentation); 0 means 4096, a negative number
	// disables the caches.
	CacheSize int
	// MaxParse is the longest text pgfence parses to fence it (see
	// sqlrewrite.Config.MaxParse); 0 for no limit.
	MaxParse int
	// TransactionPooling says a transaction pooler stands between pgfence
	// and Postgres (see proxy.Config.TransactionPooling): plans say which
	// texts need the session's token (proxy.Plan.NeedsToken), and a text
	// that would change a token setting for the session where the proxy
	// cannot follow is refused.
	TransactionPooling bool
	// DDLGuard says the database's DDL guard is in place (see
	// sqlrewrite.Config.DDLGuard).
	DDLGuard bool
	// NoticeKey is pgfence's secret in the database (see
	// backstop.ReadNoticeKey), with which the backstop marks the notices
	// of the stale writes it skips: only a notice whose mark holds is
	// counted (see Notice). "" counts none, the database's own counters
	// still do.
	NoticeKey string
	// ServerVersion is the server's server_version_num, 0 when unknown
	// (see sqlrewrite.Config.ServerVersion).
	ServerVersion int
	// StaleNotice says the database has the backstop's helpers (see
	// sqlrewrite.Config.StaleNotice): a fenced write may then go without
	// its probe (see quiet.go).
	StaleNotice bool
}

// codeStaleDomain is the SQLSTATE of a stale INSERT into a table of a lock
// domain that has a newer token (an UPDATE or DELETE changes nothing
// instead).
const codeStaleDomain = "PF001"

// maxCachedText bounds the statements the caches keep, so their memory is
// bounded by CacheSize times a few kilobytes.
const maxCachedText = 4 << 10

// Policy implements proxy.Interceptor. It is safe for concurrent use, and
// its configuration can be replaced while sessions run (Reload).
type Policy struct {
	m     *DatabaseMetrics
	log   *slog.Logger
	state atomic.Pointer[state]
	// gen is bumped by every Reload; the policies of a Databases share
	// theirs (see Databases.Generation).
	gen *atomic.Uint64
	// staleLog outlives reloads: a storm does not start over with one.
	staleLog staleLog
	onDDL    atomic.Pointer[func() <-chan struct{}]
	// pooled is the PooledSet of the last configuration asked for one.
	pooled atomic.Pointer[pooledSet]
}

// state is one configuration, swapped as a whole on reload.
type state struct {
	cfg Config
	rw  *sqlrewrite.Rewriter
	// shards hold the rewrite caches, a set per shard (see shard.go),
	// made at the shard's first use; nil when CacheSize disables them.
	shards []atomic.Pointer[caches]
	// cacheSize is each set's capacity.
	cacheSize int
	probes    sync.Map // probe SQL -> *proxy.Probe
	// setRefusals, behind a transaction pooler, are the statements that
	// refuse a plain SET or RESET of a token setting (see setRefusal).
	setRefusals map[settingKey]string
	// nonASCIINames is set when a guarded table or its schema has a name
	// that is not ASCII, which the name prefilter may then miss, and
	// nonASCIISpliced when one of those or an epoch column has, which a
	// rewrite then spells in UTF-8 (see misreadsNonASCII).
	nonASCIINames, nonASCIISpliced bool
}

// caches are one shard's rewrite caches. Each event loop has a set of its
// own: an LRU moves an entry at every hit, under its lock, which the
// loops would otherwise all take for the same few statements. The cost
// is a rewrite per loop of each text (the first time each loop sees it),
// and up to a set's capacity per loop in memory.
type caches struct {
	cache *lru.Cache[cacheKey, *planned]
	// bound holds the plans of parameterized simple-protocol writes (see
	// sqlrewrite.Parameterize), by template; nil for a template that must
	// be rewritten as sent.
	bound *lru.Cache[string, *planned]
	// texts holds the whole texts of parameterized writes, with their
	// values, so that a text sent again is a plain cache hit. They are
	// kept apart from cache: a stream of writes with new literals each
	// time would otherwise evict every other statement's rewrite.
	texts *lru.Cache[string, *planned]
	// seen admits a whole text to texts on its second sighting: most such
	// texts (a write by id) never come again, and caching each costs more
	// than the miss it would save.
	seen doorkeeper
	// passed holds, behind a transaction pooler, where texts that run as
	// the client sent them start transactions of their own, for those
	// whose finding takes a parse (see state.passedTxStarts).
	passed *lru.Cache[string, *txStarts]
}

// cachesOf returns the caches of c's shard, nil when they are disabled.
func (st *state) cachesOf(c *proxy.Client) *caches {
	if st.shards == nil {
		return nil
	}
	slot := &st.shards[shardOf(c)]
	if cs := slot.Load(); cs != nil {
		return cs
	}
	cs := &caches{}
	cs.cache, _ = lru.New[cacheKey, *planned](st.cacheSize)
	cs.bound, _ = lru.New[string, *planned](st.cacheSize)
	cs.texts, _ = lru.New[string, *planned](st.cacheSize)
	cs.passed, _ = lru.New[string, *txStarts](st.cacheSize)
	cs.seen.seed = maphash.MakeSeed()
	if !slot.CompareAndSwap(nil, cs) { // a session relayed by goroutines made it first
		return slot.Load()
	}
	return cs
}

// doorkeeper remembers hashes of recent texts, one per slot: a text whose
// hash is in its slot was (almost certainly) seen before. Slots are
// atomic, as sessions relayed by goroutines share a shard; a race costs
// at most a sighting.
type doorkeeper struct {
	seed  maphash.Seed
	slots [4096]atomic.Uint64
}

// again reports whether text was noted since its slot last changed, and
// notes it otherwise.
func (d *doorkeeper) again(text string) bool {
	h := maphash.String(d.seed, text)
	slot := &d.slots[h%uint64(len(d.slots))]
	if slot.Load() == h {
		return true
	}
	slot.Store(h)
	return false
}

type cacheKey struct {
	mode sqlrewrite.Mode
	sql  string
}

// New returns a Policy for cfg, reporting to m and log. It fences every
// session with cfg, whatever its database, and labels its series
// database="" (see Databases for one policy per database).
func New(cfg Config, m *Metrics, log *slog.Logger) (*Policy, error) {
	return newPolicy(cfg, m.Database(""), log, new(atomic.Uint64))
}

func newPolicy(cfg Config, m *DatabaseMetrics, log *slog.Logger, gen *atomic.Uint64) (*Policy, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Policy{m: m, log: log, gen: gen}
	if err := p.Reload(cfg); err != nil {
		return nil, err
	}
	return p, nil
}

// Reload switches to cfg. Statements already sent keep the configuration
// they were rewritten with; a prepared statement keeps the text it was
// prepared with.
func (p *Policy) Reload(cfg Config) error {
	if cfg.TokenSetting == "" {
		cfg.TokenSetting = "fence.token"
	}
	rw, err := sqlrewrite.New(sqlrewrite.Config{Guards: cfg.Guards, TokenSetting: cfg.TokenSetting, Allow: cfg.Allow, DDLGuard: cfg.DDLGuard,
		ServerVersion: cfg.ServerVersion, StaleNotice: cfg.StaleNotice, MaxParse: cfg.MaxParse})
	if err != nil {
		return err
	}
	st := &state{cfg: cfg, rw: rw}
	if cfg.TransactionPooling {
		st.setRefusals = setRefusals(rw, cfg.TokenSetting)
	}
	for _, g := range cfg.Guards {
		if !isASCII(g.Table) || !isASCII(g.Schema) {
			st.nonASCIINames = true
		}
		if !isASCII(g.Table) || !isASCII(g.Schema) || !isASCII(g.Column) {
			st.nonASCIISpliced = true
		}
	}
	if size := cfg.CacheSize; size >= 0 {
		if size == 0 {
			size = 4096
		}
		st.shards, st.cacheSize = make([]atomic.Pointer[caches], loopstat.Shards), size
	}
	p.m.guards(cfg.Guards)
	p.m.guarded.Set(float64(len(cfg.Guards)))
	p.state.Store(st)
	p.gen.Add(1)
	return nil
}

// Generation implements proxy.Interceptor: it changes on every Reload, so
// statements prepared before are planned again.
func (p *Policy) Generation() uint64 { return p.gen.Load() }

// Config returns the configuration in force.
func (p *Policy) Config() Config { return p.state.Load().cfg }

// SessionStart implements proxy.Interceptor.
func (p *Policy) SessionStart(c *proxy.Client) {
	c.Local = &session{policy: p}
	p.m.connsTotal.Inc()
	p.m.connsActive.Inc()
}

// SessionEnd implements proxy.Interceptor.
func (p *Policy) SessionEnd(c *proxy.Client, err error) {
	p.m.connsActive.Dec()
	if err != nil {
		p.m.sessionErrors.Inc(shardOf(c))
	}
}

// SettingAnswered implements proxy.Interceptor.
func (p *Policy) SettingAnswered(c *proxy.Client, _ *proxy.Setting) { p.m.setsAnswered.Inc(shardOf(c)) }

// Query implements proxy.Interceptor.
func (p *Policy) Query(c *proxy.Client, sql string) proxy.Plan {
	return p.plan(c, sql, sqlrewrite.Simple)
}

// Parse implements proxy.Interceptor.
func (p *Policy) Parse(c *proxy.Client, sql string) proxy.Plan {
	return p.plan(c, sql, sqlrewrite.Prepared)
}
