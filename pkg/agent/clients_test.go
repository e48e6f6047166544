package agent

import (
	"context"

	"github.com/hagroup/hagroup/pkg/fleet"
)

func (b *testBackend) Report(ctx context.Context, peer Peer, rep fleet.Report) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reports = append(b.reports, peerReport{peer, rep})
	return nil
}

func (b *testBackend) Clients(ctx context.Context) (ClientsReport, error) {
	return ClientsReport{}, nil
}

type peerReport struct {
	peer Peer
	rep  fleet.Report
}
