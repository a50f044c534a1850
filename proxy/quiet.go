package proxy

// A fenced write the proxy watches instead of probing (see Quiet).

// watch returns the wait for the Execute of a write whose probe p (nil:
// none) the proxy may leave out, set being the settings it set right
// ahead of the write (nil: none), or nil when it must run p.
func (l *link) watch(p *Probe, c *Client, set []Setting) *wait {
	if p == nil || set == nil || p.quiet == nil || !p.quiet.Known(c, set) {
		return nil
	}
	w := l.pipe.get(waitExecute)
	w.quiet, w.set = p, append(w.set[:0], set...)
	return w
}

// quietDone tells the Quiet of the write w watches that it completed, and
// sends the client the notice that returns, if any.
func (s *session) quietDone(w *wait) error {
	nr := w.quiet.quiet.Done(s.c, w.set, w.notes)
	if nr == nil {
		return nil
	}
	b, err := nr.Encode(nil)
	if err != nil {
		return err
	}
	_, err = s.cw.Write(b)
	return err
}
