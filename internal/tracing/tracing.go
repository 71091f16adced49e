package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvfast/kvfast/internal/logthrottle"
)

// Config is what --otlp-endpoint and its companions set.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP address: http://host:4318 or
	// https://host:4318, where an empty path or "/" means the standard
	// /v1/traces, and any other path is used as it is. "" turns tracing
	// off.
	Endpoint string
	// ServiceName is the service.name resource attribute of every span.
	ServiceName string
	// SampleRatio is the share of requests traced that arrive without a
	// sampled traceparent (1: all); a request whose client sampled it is
	// always traced, one whose client did not is never, so that a trace
	// is whole across services.
	SampleRatio float64
	// Logger, when set, gets the exporter's errors (a collector down or
	// refusing spans), at most one a minute, instead of the OpenTelemetry
	// default, which prints each in plain text to stderr and breaks a JSON
	// log.
	Logger *slog.Logger
}

// DefaultConfig has tracing off; setting Endpoint turns it on.
func DefaultConfig() Config {
	return Config{ServiceName: "kvfast", SampleRatio: 1}
}

// Validate reports a setting New cannot use.
func (c *Config) Validate() error {
	// Checked with or without an endpoint: a bad ratio is a typo now, not
	// only once tracing is turned on.
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) {
		return fmt.Errorf("cannot use trace sample ratio %v: want 0..1", c.SampleRatio)
	}
	if c.Endpoint == "" {
		return nil
	}
	if _, err := parseEndpoint(c.Endpoint); err != nil {
		return err
	}
	if err := checkHeaders(os.Getenv("OTEL_EXPORTER_OTLP_HEADERS"), os.Getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS")); err != nil {
		return err
	}
	if c.ServiceName == "" {
		return errors.New("cannot trace without a service name")
	}
	return nil
}

// checkHeaders refuses OTLP header settings the exporter cannot parse:
// it would log them, credentials and all, and export without them. The
// format is the OpenTelemetry one: comma-separated key=value pairs,
// values URL-encoded. The error names the variable and the entry's
// place, never its text.
func checkHeaders(vars ...string) error {
	names := []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"}
	for i, v := range vars {
		if v == "" {
			continue
		}
		for j, entry := range strings.Split(v, ",") {
			key, value, ok := strings.Cut(entry, "=")
			if strings.TrimSpace(key) == "" || !ok {
				return fmt.Errorf("cannot use %s: entry %d is not key=value", names[i], j+1)
			}
			if _, err := url.PathUnescape(strings.TrimSpace(value)); err != nil {
				return fmt.Errorf("cannot use %s: the value of entry %d is not URL-encoded (write %%25 for a %%)", names[i], j+1)
			}
		}
	}
	return nil
}

// parseEndpoint splits an OTLP/HTTP endpoint into the exporter's options.
func parseEndpoint(endpoint string) ([]otlptracehttp.Option, error) {
	// The errors never quote the endpoint whole: a collector's
	// credentials may be in it (refused below, but not to be printed).
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, errors.New("cannot use the OTLP endpoint: it is not a URL; want http://host:port or https://host:port")
	}
	shown := u.Scheme + "://" + u.Host + u.Path
	switch {
	case u.Scheme == "" || u.Opaque != "":
		// A bare word or host:port (which parses as scheme "host"):
		// quoting "://garbage" or "collector://" would show what the
		// operator never wrote.
		return nil, errors.New("cannot use the OTLP endpoint: it names no http:// or https:// scheme; want http://host:port or https://host:port")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("cannot use OTLP endpoint %q: want http://host:port or https://host:port", shown)
	case u.Host == "":
		return nil, fmt.Errorf("cannot use OTLP endpoint %q: it names no host", shown)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return nil, fmt.Errorf("cannot use OTLP endpoint %q: want no query, fragment or credentials (set headers with OTEL_EXPORTER_OTLP_HEADERS)", shown)
	}
	path := u.Path
	if path == "" || path == "/" {
		path = "/v1/traces"
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return opts, nil
}

// Provider exports the spans of one router.
type Provider struct {
	tp       *sdktrace.TracerProvider
	tracer   trace.Tracer
	shutOnce sync.Once
	shutErr  error
}

// New starts a provider exporting to cfg.Endpoint, or returns nil when
// the endpoint is empty (tracing off). It does not contact the collector:
// a collector that is down costs dropped spans, never requests.
func New(cfg Config) (*Provider, error) {
	if cfg.Endpoint == "" {
		return nil, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("cannot create the OTLP exporter: %w", err)
	}
	if cfg.Logger != nil {
		// The handler is the process's, as OpenTelemetry has one.
		throttle := logthrottle.New(time.Minute)
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			throttle.Log(cfg.Logger, slog.LevelWarn, "export", "cannot export traces: spans are dropped", "err", err)
		}))
	}
	res := resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	)
	return &Provider{tp: tp, tracer: tp.Tracer("github.com/kvfast/kvfast")}, nil
}

// Tracer is what the front end starts spans with; nil for a nil
// Provider (tracing off).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tracer
}

// Shutdown exports the spans still buffered, within ctx, and stops the
// exporter. Later calls return the first one's result.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	p.shutOnce.Do(func() {
		if err := p.tp.Shutdown(ctx); err != nil {
			p.shutErr = fmt.Errorf("cannot flush the trace exporter: %w", err)
		}
	})
	return p.shutErr
}

// Propagator reads and writes W3C trace context: traceparent and
// tracestate.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}
