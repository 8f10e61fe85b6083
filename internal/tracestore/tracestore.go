// Package tracestore reads traces back from a trace store's query API: the
// Jaeger query service's HTTP JSON API (`/api/services`, `/api/traces`),
// which Jaeger v1 and v2 both serve. elasticctl uses it to show a job's
// resizes as a waterfall of spans; the tests use it to check what the fleet
// exported.
package tracestore

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Trace is one trace: its spans, earliest first (parents before their
// children when they start at the same instant).
type Trace struct {
	TraceID string
	Spans   []Span
}

// Span is one span of a trace.
type Span struct {
	TraceID, SpanID, ParentSpanID, Service, Operation string
	Start                                             time.Time
	Duration                                          time.Duration
	// Attributes are the span's tags, each value as text.
	Attributes map[string]string
	// Resource is the attributes of the process that made the span (its
	// OTel resource, Jaeger's process tags), such as hyperpodrun.node.
	Resource map[string]string
}

// nodeResource is the resource attribute naming the fleet node
// (internal/telemetry.NodeAttr).
const nodeResource = "hyperpodrun.node"

// Node is the fleet node the span is about: its node attribute, else its
// process's.
func (s Span) Node() string {
	if n := s.Attributes["node"]; n != "" {
		return n
	}
	return s.Resource[nodeResource]
}

// Root returns the trace's root span (the earliest span without a parent
// in the trace); ok is false for an empty trace.
func (t Trace) Root() (Span, bool) {
	ids := make(map[string]bool, len(t.Spans))
	for _, s := range t.Spans {
		ids[s.SpanID] = true
	}
	for _, s := range t.Spans {
		if s.ParentSpanID == "" || !ids[s.ParentSpanID] {
			return s, true
		}
	}
	return Span{}, false
}

// Start is the start of the trace's earliest span.
func (t Trace) Start() time.Time {
	var min time.Time
	for i, s := range t.Spans {
		if i == 0 || s.Start.Before(min) {
			min = s.Start
		}
	}
	return min
}

// maxBody bounds what the client reads of one answer.
const maxBody = 64 << 20

// Client reads a Jaeger query service.
type Client struct {
	base string
	http *http.Client
}

// NewClient returns a client of the query service at queryURL (for
// example "http://127.0.0.1:16686").
func NewClient(queryURL string) *Client {
	return &Client{base: strings.TrimRight(queryURL, "/"), http: &http.Client{Timeout: 30 * time.Second}}
}

// Services lists the services the store holds spans of.
func (c *Client) Services(ctx context.Context) ([]string, error) {
	body, err := c.get(ctx, "/api/services", nil)
	if err != nil {
		return nil, err
	}
	return ParseServices(body)
}

// Traces returns up to limit traces (0: the store's default) that hold a
// span of service carrying every tag in tags, newest first.
func (c *Client) Traces(ctx context.Context, service string, tags map[string]string, limit int) ([]Trace, error) {
	q := url.Values{"service": {service}}
	if len(tags) > 0 {
		b, err := json.Marshal(tags)
		if err != nil {
			return nil, fmt.Errorf("tracestore: encode tags: %w", err)
		}
		q.Set("tags", string(b))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	body, err := c.get(ctx, "/api/traces", q)
	if err != nil {
		return nil, err
	}
	ts, err := ParseTraces(body)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(ts, func(i, j int) bool { return ts[i].Start().After(ts[j].Start()) })
	return ts, nil
}

func (c *Client) get(ctx context.Context, path string, q url.Values) ([]byte, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("tracestore: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tracestore: query %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("tracestore: read %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(body))
		if len(msg) > 300 {
			msg = msg[:300]
		}
		return nil, fmt.Errorf("tracestore: GET %s: %s: %s", path, resp.Status, msg)
	}
	return body, nil
}

// The query API's JSON (the Jaeger UI's model).
type (
	apiResponse struct {
		Data   json.RawMessage `json:"data"`
		Errors []apiError      `json:"errors"`
	}
	apiError struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	}
	apiTrace struct {
		TraceID   string                `json:"traceID"`
		Spans     []apiSpan             `json:"spans"`
		Processes map[string]apiProcess `json:"processes"`
	}
	apiSpan struct {
		TraceID       string   `json:"traceID"`
		SpanID        string   `json:"spanID"`
		OperationName string   `json:"operationName"`
		References    []apiRef `json:"references"`
		StartTime     int64    `json:"startTime"` // µs since the epoch
		Duration      int64    `json:"duration"`  // µs
		Tags          []apiTag `json:"tags"`
		ProcessID     string   `json:"processID"`
	}
	apiRef struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	}
	apiTag struct {
		Key   string          `json:"key"`
		Type  string          `json:"type"`
		Value json.RawMessage `json:"value"`
	}
	apiProcess struct {
		ServiceName string   `json:"serviceName"`
		Tags        []apiTag `json:"tags"`
	}
)

func parseEnvelope(body []byte) (json.RawMessage, error) {
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("tracestore: decode answer: %w", err)
	}
	if len(r.Errors) > 0 {
		msgs := make([]string, 0, len(r.Errors))
		for _, e := range r.Errors {
			msgs = append(msgs, fmt.Sprintf("%d %s", e.Code, e.Msg))
		}
		return nil, fmt.Errorf("tracestore: query error: %s", strings.Join(msgs, "; "))
	}
	return r.Data, nil
}

// ParseServices decodes an `/api/services` answer.
func ParseServices(body []byte) ([]string, error) {
	data, err := parseEnvelope(body)
	if err != nil {
		return nil, err
	}
	var s []string
	if len(data) > 0 && string(data) != "null" {
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, fmt.Errorf("tracestore: decode services: %w", err)
		}
	}
	sort.Strings(s)
	return s, nil
}

// ParseTraces decodes an `/api/traces` answer. A span's parent is its
// CHILD_OF reference (else its first reference) in the same trace.
func ParseTraces(body []byte) ([]Trace, error) {
	data, err := parseEnvelope(body)
	if err != nil {
		return nil, err
	}
	var raw []apiTrace
	if len(data) > 0 && string(data) != "null" {
		if err := json.Unmarshal(data, &raw); err != nil {
			return nil, fmt.Errorf("tracestore: decode traces: %w", err)
		}
	}
	out := make([]Trace, 0, len(raw))
	for _, at := range raw {
		t, err := convertTrace(at)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func convertTrace(at apiTrace) (Trace, error) {
	t := Trace{TraceID: at.TraceID, Spans: make([]Span, 0, len(at.Spans))}
	for _, as := range at.Spans {
		if as.SpanID == "" {
			return Trace{}, fmt.Errorf("tracestore: trace %s: a span without spanID", at.TraceID)
		}
		if as.Duration < 0 {
			return Trace{}, fmt.Errorf("tracestore: trace %s span %s: negative duration %d", at.TraceID, as.SpanID, as.Duration)
		}
		s := Span{TraceID: as.TraceID, SpanID: as.SpanID, Operation: as.OperationName,
			Start: time.UnixMicro(as.StartTime).UTC(), Duration: time.Duration(as.Duration) * time.Microsecond,
			Attributes: make(map[string]string, len(as.Tags))}
		if s.TraceID == "" {
			s.TraceID = at.TraceID
		}
		if t.TraceID == "" {
			t.TraceID = s.TraceID
		}
		s.ParentSpanID = parentOf(as.References)
		if p, ok := at.Processes[as.ProcessID]; ok {
			s.Service = p.ServiceName
			if len(p.Tags) > 0 {
				s.Resource = make(map[string]string, len(p.Tags))
				for _, tag := range p.Tags {
					s.Resource[tag.Key] = tagText(tag.Value)
				}
			}
		}
		for _, tag := range as.Tags {
			s.Attributes[tag.Key] = tagText(tag.Value)
		}
		t.Spans = append(t.Spans, s)
	}
	sortSpans(t.Spans)
	return t, nil
}

func parentOf(refs []apiRef) string {
	for _, r := range refs {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	if len(refs) > 0 {
		return refs[0].SpanID
	}
	return ""
}

// tagText is a tag's value as text: a JSON string unquoted, anything else
// (numbers, booleans) as written.
func tagText(v json.RawMessage) string {
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		return s
	}
	return strings.TrimSpace(string(v))
}

// sortSpans orders spans by start, a parent before its children at the
// same instant, then by span ID (a stable order for equal starts).
func sortSpans(ss []Span) {
	sort.SliceStable(ss, func(i, j int) bool {
		a, b := ss[i], ss[j]
		if !a.Start.Equal(b.Start) {
			return a.Start.Before(b.Start)
		}
		if b.ParentSpanID == a.SpanID {
			return true
		}
		if a.ParentSpanID == b.SpanID {
			return false
		}
		return a.SpanID < b.SpanID
	})
}
