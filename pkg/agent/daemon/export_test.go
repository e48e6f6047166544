package daemon

import "time"

// MetricsAddr returns the address the metrics endpoint listens on ("" when
// off or not yet listening).
func (d *Daemon) MetricsAddr() string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.metricsAddr
}

// AgeComparison moves group label's last comparison of its members back by
// age, as if the agent's checks had stalled that long, and returns when it
// now started.
func (d *Daemon) AgeComparison(label string, age time.Duration) time.Time {
	d.mu.RLock()
	gr := d.groups[label]
	d.mu.RUnlock()
	gr.mu.Lock()
	defer gr.mu.Unlock()
	gr.compared.at = gr.compared.at.Add(-age)
	return gr.compared.at
}

// HoldComparison takes group label's comparison token, as a comparison
// that does not finish would, until the returned release is called.
func (d *Daemon) HoldComparison(label string) (release func()) {
	d.mu.RLock()
	gr := d.groups[label]
	d.mu.RUnlock()
	gr.comparing <- struct{}{}
	return func() { <-gr.comparing }
}
