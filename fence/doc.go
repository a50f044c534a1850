// Package fence is pgfence's policy: which tables are guarded, what a write
// to one becomes, how stale writes are classified and counted, and what the
// client is told. It implements proxy.Interceptor.
package fence
