package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"
)

// Elector holds a coordination.k8s.io/v1 Lease for active-standby
// pickers: every replica follows the endpoints and their events (a warm
// standby), and only the Lease's holder answers readiness, so that the
// gateway, through the picker's Service, sends its streams to it alone.
//
// Like client-go's leader election, a claim is judged expired by the
// time this replica last saw the Lease change, not by the holder's clock:
// a holder that stopped renewing loses the Lease Duration after its last
// renewal was seen. Writes carry the resourceVersion they read, so two
// replicas racing for an expired Lease cannot both win.
type Elector struct {
	Kube     *Kube  // the API server, token and namespace
	Name     string // the Lease's name
	Identity string // this replica's (its pod name)
	// Duration is how long a claim lasts without renewal; the holder
	// renews, and the others look, every Duration/3.
	Duration time.Duration
	Logger   *slog.Logger

	seen      leaseSpec // the Lease as last read
	seenAt    time.Time // when it last changed
	renewedAt time.Time // when this replica last renewed its claim
}

type leaseSpec struct {
	HolderIdentity       string `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds int    `json:"leaseDurationSeconds,omitempty"`
	AcquireTime          string `json:"acquireTime,omitempty"`
	RenewTime            string `json:"renewTime,omitempty"`
	LeaseTransitions     int    `json:"leaseTransitions,omitempty"`
}

type lease struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string `json:"name"`
		Namespace       string `json:"namespace,omitempty"`
		ResourceVersion string `json:"resourceVersion,omitempty"`
	} `json:"metadata"`
	Spec leaseSpec `json:"spec"`
}

// microTime is the Lease's time format (metav1.MicroTime).
const microTime = "2006-01-02T15:04:05.000000Z07:00"

// Run tries for the Lease every Duration/3 until ctx ends, and calls
// leading whenever this replica gains or loses it (once with false at the
// start). At the end it gives the Lease up, so that a standby takes over
// at once rather than after Duration.
func (e *Elector) Run(ctx context.Context, leading func(bool)) {
	log := e.Logger
	if log == nil {
		log = slog.Default()
	}
	lead := false
	leading(false)
	t := time.NewTicker(e.Duration / 3)
	defer t.Stop()
	for {
		now, err := e.try(ctx)
		switch {
		case err != nil && lead && time.Since(e.renewedAt) > e.Duration:
			// The claim ran out before it could be renewed: another
			// replica may hold the Lease by now.
			log.Error("lost the lease: cannot renew it", "lease", e.Name, "err", err)
			now = false
		case err != nil:
			now = lead
			if ctx.Err() == nil {
				log.Warn("cannot reach the lease", "lease", e.Name, "err", err)
			}
		}
		if now != lead {
			lead = now
			log.Info("lease changed hands", "lease", e.Name, "identity", e.Identity, "leading", lead)
			leading(lead)
		}
		select {
		case <-ctx.Done():
			if lead {
				e.release()
				leading(false)
			}
			return
		case <-t.C:
		}
	}
}

func (e *Elector) path() string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + url.PathEscape(e.Kube.Namespace) + "/leases"
}

// try reads the Lease and claims or renews it when it may; it reports
// whether this replica holds it now.
func (e *Elector) try(ctx context.Context) (bool, error) {
	status, body, err := e.Kube.call(ctx, http.MethodGet, e.path()+"/"+url.PathEscape(e.Name), nil, nil)
	if err != nil {
		return false, err
	}
	now := time.Now()
	claim := leaseSpec{HolderIdentity: e.Identity, LeaseDurationSeconds: int((e.Duration + time.Second - 1) / time.Second),
		AcquireTime: now.UTC().Format(microTime), RenewTime: now.UTC().Format(microTime)}
	switch status {
	case http.StatusNotFound:
		var l lease
		l.APIVersion, l.Kind, l.Metadata.Name, l.Spec = "coordination.k8s.io/v1", "Lease", e.Name, claim
		return e.write(ctx, http.MethodPost, e.path(), &l)
	case http.StatusOK:
	default:
		return false, fmt.Errorf("cannot read lease %s: the API server answered %d: %s", e.Name, status, firstLine(body))
	}
	var l lease
	if err := json.Unmarshal(body, &l); err != nil {
		return false, fmt.Errorf("cannot decode lease %s: %w", e.Name, err)
	}
	if l.Spec != e.seen {
		e.seen, e.seenAt = l.Spec, now
	}
	held := l.Spec.HolderIdentity != "" && l.Spec.HolderIdentity != e.Identity
	if held && now.Sub(e.seenAt) < e.Duration {
		return false, nil // another replica's claim is alive
	}
	if l.Spec.HolderIdentity == e.Identity {
		claim.AcquireTime, claim.LeaseTransitions = l.Spec.AcquireTime, l.Spec.LeaseTransitions
	} else {
		claim.LeaseTransitions = l.Spec.LeaseTransitions + 1
	}
	l.Spec = claim
	return e.write(ctx, http.MethodPut, e.path()+"/"+url.PathEscape(e.Name), &l)
}

// write creates or replaces the Lease with this replica's claim; a
// conflict means another replica wrote it first.
func (e *Elector) write(ctx context.Context, method, path string, l *lease) (bool, error) {
	status, body, err := e.Kube.call(ctx, method, path, nil, l)
	switch {
	case err != nil:
		return false, err
	case status == http.StatusOK || status == http.StatusCreated:
		e.renewedAt = time.Now()
		return true, nil
	case status == http.StatusConflict:
		return false, nil
	}
	return false, fmt.Errorf("cannot claim lease %s: the API server answered %d: %s", e.Name, status, firstLine(body))
}

// release gives the Lease up, if this replica still holds it.
func (e *Elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	status, body, err := e.Kube.call(ctx, http.MethodGet, e.path()+"/"+url.PathEscape(e.Name), nil, nil)
	if err != nil || status != http.StatusOK {
		return
	}
	var l lease
	if json.Unmarshal(body, &l) != nil || l.Spec.HolderIdentity != e.Identity {
		return
	}
	l.Spec.HolderIdentity, l.Spec.RenewTime = "", time.Now().UTC().Format(microTime)
	_, _, _ = e.Kube.call(ctx, http.MethodPut, e.path()+"/"+url.PathEscape(e.Name), nil, &l)
}
