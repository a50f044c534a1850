package proxy

// A fenced write the proxy watches instead of probing (see Quiet).

// watch returns the wait for the Execute of a write whose probe is p (nil:
// none), where quiet is the probe the deferred settings set right ahead of
// it (set) were sent for with the quiet mark (nil: none); or nil when the
// proxy must run p (a reload may have planned the statement again since).
func (l *link) watch(p, quiet *Probe, set []Setting) *wait {
	if p == nil || p != quiet {
		return nil
	}
	w := l.pipe.get(waitExecute)
	w.quiet, w.set = p, append(w.set[:0], set...)
	return w
}

// quietDone tells the Quiet of the write w watches that it completed, and
// sends the client the notice that returns, if any.
func (s *session) quietDone(w *wait) error {
	return s.tell(w.quiet.quiet.Done(s.c, w.set, w.notes))
}
