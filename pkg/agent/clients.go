package agent

import (
	"context"
	"net/http"
	"time"
)

// FleetBackend is the part of the Backend that hears the processes
// running a group's engine (pkg/fleet) and lists them.
type FleetBackend interface {
	// Report records a report from peer (whose uid and pid come from
	// SO_PEERCRED, not from the report). An *Error refuses it.
	Report(ctx context.Context, peer Peer, rep FleetReport) error
	// Clients lists the processes that reported recently.
	Clients(ctx context.Context) (ClientsReport, error)
}

// maxReportBody bounds a report: MaxGroups×MaxMembers members and
// MaxEvents events of bounded size fit well within it.
const maxReportBody = 512 << 10

// ClientsReport is the answer to hactl hagroup clients.
type ClientsReport struct {
	SchemaVersion int            `json:"schemaVersion"`
	Clients       []ClientStatus `json:"clients"`
	// MaxClients is how many processes the agent keeps at most, and
	// MaxPerUID how many of them one uid may have; Expiry is how long a
	// silent one is kept.
	MaxClients int    `json:"maxClients"`
	MaxPerUID  int    `json:"maxPerUid"`
	Expiry     string `json:"expiry"`
}

// ClientStatus is one reporting process. UID and PID are the kernel's
// (SO_PEERCRED); Program and Host are what the process says.
type ClientStatus struct {
	PID      int          `json:"pid"`
	UID      int          `json:"uid"`
	Program  string       `json:"program"`
	Host     string       `json:"host"`
	Started  time.Time    `json:"started"`
	LastSeen time.Time    `json:"lastSeen"`
	Groups   []FleetGroup `json:"groups"`
	// DroppedEvents the process could not queue, and the agent refused
	// to log (past the per-client budget).
	DroppedEvents uint64 `json:"droppedEvents,omitempty"`
}

func (s *Server) serveReport(w http.ResponseWriter, r *http.Request) (any, error) {
	rep, err := decodeBodyLimit[FleetReport](r.Body, maxReportBody)
	if err != nil {
		return nil, err
	}
	if err := s.backend.Report(r.Context(), decisionOf(r.Context()).Peer, rep); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

func (s *Server) serveClients(w http.ResponseWriter, r *http.Request) (any, error) {
	if len(r.URL.Query()) > 0 {
		return nil, Errorf(CodeBadRequest, "clients takes no query parameters")
	}
	res, err := s.backend.Clients(r.Context())
	if err != nil {
		return nil, err
	}
	res.SchemaVersion = SchemaVersion
	if res.Clients == nil {
		res.Clients = []ClientStatus{}
	}
	return res, nil
}

// Clients lists the processes reporting to the agent.
func (c *Client) Clients(ctx context.Context) (ClientsReport, error) {
	var v ClientsReport
	return v, c.call(ctx, http.MethodGet, "/v1/clients", nil, nil, &v)
}
