package proxy

import "github.com/jackc/pgx/v5/pgproto3"

// NopInterceptor is an Interceptor that changes nothing: every message
// passes as the client or the server sent it. Embed it in an Interceptor
// of one's own and write only the hooks that matter, as with Vitess's
// UnimplementedHandler; a hook added to Interceptor later then passes
// through until one writes it.
type NopInterceptor struct{}

var _ Interceptor = NopInterceptor{}

// SessionStart does nothing.
func (NopInterceptor) SessionStart(*Client) {}

// SessionEnd does nothing.
func (NopInterceptor) SessionEnd(*Client, error) {}

// Query forwards the text.
func (NopInterceptor) Query(*Client, string) Plan { return Plan{} }

// Parse forwards the text.
func (NopInterceptor) Parse(*Client, string) Plan { return Plan{} }

// Error keeps the server's error.
func (NopInterceptor) Error(*Client, *pgproto3.ErrorResponse) *pgproto3.ErrorResponse { return nil }

// Notice lets the client have every notice.
func (NopInterceptor) Notice(*Client, *pgproto3.NoticeResponse) bool { return true }

// SettingAnswered does nothing.
func (NopInterceptor) SettingAnswered(*Client, *Setting) {}

// Generation never changes.
func (NopInterceptor) Generation() uint64 { return 0 }

// DependsOnReading holds nothing.
func (NopInterceptor) DependsOnReading(*Client, string) bool { return false }

// ReadingProbe needs no probe.
func (NopInterceptor) ReadingProbe() *Probe { return nil }
