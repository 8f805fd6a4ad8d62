package memoria

// The generated Go stubs (google.golang.org/grpc) against a running Memoria server. The tests
// start nothing: scripts/test-clients.sh starts the server and passes its address in
// MEMORIA_SERVER (host:port on loopback, trusted-headers mode; the older MEMORIA_ADDR is read
// too). Without either the server tests fail; only the character-count vectors run on their own.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	memoriav1 "memoria/generated/go/memoria/v1"
)

const limit = 4000

// tenant is fresh per run, so runs against the same server never see each other's data.
var tenant = "go-" + randomHex(4)

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// ---- the shared character-count vectors (tests/vectors/README.md) ----

// text is a vector text: a JSON string, or an array of parts (strings or repeats).
type text string

func (t *text) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		*t = text(s)
		return nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(data, &parts); err != nil {
		return err
	}
	var b strings.Builder
	for _, raw := range parts {
		var part string
		if err := json.Unmarshal(raw, &part); err == nil {
			b.WriteString(part)
			continue
		}
		var rep struct {
			Repeat *string `json:"repeat"`
			Times  *int    `json:"times"`
		}
		if err := json.Unmarshal(raw, &rep); err != nil || rep.Repeat == nil || rep.Times == nil {
			return fmt.Errorf("bad text part %s", raw)
		}
		b.WriteString(strings.Repeat(*rep.Repeat, *rep.Times))
	}
	*t = text(b.String())
	return nil
}

type vectorCase struct {
	Name      string `json:"name"`
	Input     text   `json:"input"`
	Sanitized text   `json:"sanitized"`
	CharCount int    `json:"char_count"`
	Empty     bool   `json:"empty"`
	OverLimit bool   `json:"over_limit"`
}

type vectorFile struct {
	Limit int          `json:"limit"`
	Cases []vectorCase `json:"cases"`
}

func loadVectors(t *testing.T) vectorFile {
	t.Helper()
	data, err := os.ReadFile("../../tests/vectors/char_count.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if v.Limit != limit || len(v.Cases) < 50 {
		t.Fatalf("unexpected vectors: limit %d, %d cases", v.Limit, len(v.Cases))
	}
	return v
}

func TestCharCountVectors(t *testing.T) {
	v := loadVectors(t)
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			got := Sanitize(string(c.Input))
			if got != string(c.Sanitized) {
				t.Errorf("Sanitize = %+q, want %+q", got, c.Sanitized)
			}
			n := CharCount(string(c.Input))
			if n != c.CharCount || (n == 0) != c.Empty || (n > v.Limit) != c.OverLimit {
				t.Errorf("CharCount = %d, want %d (empty %v, over %v)", n, c.CharCount, c.Empty, c.OverLimit)
			}
		})
	}
}

func TestCharCountIsRunesNotBytes(t *testing.T) {
	s := strings.Repeat("\U0001F600", limit)
	if len(s) != 4*limit || CharCount(s) != limit {
		t.Fatalf("len %d, CharCount %d", len(s), CharCount(s))
	}
}

func TestUnicodeVersionSensitiveVector(t *testing.T) {
	// U+13439..U+1343F became Cf in Unicode 15; the server (Unicode 18) removes them, and so
	// must this helper, which takes its categories from Go's unicode package.
	if !unicode.Is(unicode.Cf, 0x13439) {
		t.Fatalf("Go's unicode tables (%s) predate Unicode 15", unicode.Version)
	}
	v := loadVectors(t)
	i := slices.IndexFunc(v.Cases, func(c vectorCase) bool { return c.Name == "egyptian_format_controls_unicode15" })
	if i < 0 {
		t.Fatal("the vectors lost the Unicode-version case")
	}
	if n := CharCount(string(v.Cases[i].Input)); n != v.Cases[i].CharCount {
		t.Fatalf("CharCount = %d, want %d", n, v.Cases[i].CharCount)
	}
}

// ---- the live server ----

type clients struct {
	blocks memoriav1.MemoryBlockServiceClient
	audit  memoriav1.AuditServiceClient
	search memoriav1.ConversationSearchServiceClient
}

// dial connects to the server that MEMORIA_SERVER (or the older MEMORIA_ADDR) names.
func dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	addr := os.Getenv("MEMORIA_SERVER")
	if addr == "" {
		addr = os.Getenv("MEMORIA_ADDR")
	}
	if addr == "" {
		t.Fatal("MEMORIA_SERVER is not set: scripts/test-clients.sh starts the server and sets it")
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func connect(t *testing.T) clients {
	t.Helper()
	conn := dial(t)
	return clients{
		memoriav1.NewMemoryBlockServiceClient(conn),
		memoriav1.NewAuditServiceClient(conn),
		memoriav1.NewConversationSearchServiceClient(conn),
	}
}

// as is a context carrying the trusted-headers identity of one principal of this run's tenant.
func as(t *testing.T, principal string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx,
		"x-memoria-tenant", tenant, "x-memoria-principal", principal)
}

// expectError checks err's code and its google.rpc.ErrorInfo, and returns the ErrorInfo and
// the fields named by a google.rpc.BadRequest, if any.
func expectError(t *testing.T, err error, code codes.Code, reason memoriav1.ErrorReason) (*errdetails.ErrorInfo, []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected %s %s, but the call succeeded", code, reason)
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a gRPC status: %v", err)
	}
	if st.Code() != code {
		t.Fatalf("code %s (%s), want %s", st.Code(), st.Message(), code)
	}
	var info *errdetails.ErrorInfo
	var fields []string
	for _, d := range st.Details() { // decoded from grpc-status-details-bin
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if info != nil {
				t.Fatal("more than one ErrorInfo")
			}
			info = d
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		case error:
			t.Fatalf("undecodable detail: %v", d)
		}
	}
	if info == nil {
		t.Fatalf("no ErrorInfo in %v", st.Details())
	}
	if info.GetDomain() != "memoria.v1" || memoriav1.ErrorReason(memoriav1.ErrorReason_value[info.GetReason()]) != reason {
		t.Fatalf("ErrorInfo %s/%s, want memoria.v1/%s", info.GetDomain(), info.GetReason(), reason)
	}
	return info, fields
}

func rewrite(text string, writer memoriav1.Writer) *memoriav1.RewriteMemoryBlockRequest {
	return &memoriav1.RewriteMemoryBlockRequest{Text: text, Writer: writer}
}

func TestBlockLifecycle(t *testing.T) {
	c := connect(t)
	ctx := as(t, "ana")
	text := "Preferred name: Ana\nUses Jira account ana-42\nLikes short answers \U0001F600"

	written, err := c.blocks.RewriteMemoryBlock(ctx, rewrite(text, memoriav1.Writer_WRITER_MODEL))
	if err != nil {
		t.Fatal(err)
	}
	block := written.GetMemoryBlock()
	if !written.GetChanged() || len(written.GetRemovedLines()) != 0 ||
		!slices.Equal(written.GetAddedLines(), strings.Split(text, "\n")) {
		t.Fatalf("first rewrite: %v", written)
	}
	if block.GetText() != text || int(block.GetCharCount()) != CharCount(text) ||
		block.GetCharLimit() != limit || block.GetEtag() == "" || block.GetUpdateTime() == nil {
		t.Fatalf("saved block: %v", block)
	}
	if int(block.GetCharCount()) == len(text) {
		t.Fatal("char_count counted bytes")
	}

	got, err := c.blocks.GetMemoryBlock(ctx, &memoriav1.GetMemoryBlockRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.GetMemoryBlock(), block) {
		t.Fatalf("get: %v, want %v", got.GetMemoryBlock(), block)
	}

	rendered, err := c.blocks.RenderMemoryBlock(ctx, &memoriav1.RenderMemoryBlockRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantSection := fmt.Sprintf("Personal memory (%d/4,000 characters)\n%s", block.GetCharCount(), text)
	if rendered.GetPromptSection() != wantSection || rendered.GetEtag() != block.GetEtag() ||
		rendered.GetCharCount() != block.GetCharCount() {
		t.Fatalf("render: %v", rendered)
	}

	// A conditional rewrite changes one line; the diff names exactly that line.
	text2 := strings.Replace(text, "short", "detailed", 1)
	req := rewrite(text2, memoriav1.Writer_WRITER_USER)
	req.Etag = proto.String(block.GetEtag())
	second, err := c.blocks.RewriteMemoryBlock(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(second.GetRemovedLines(), []string{"Likes short answers \U0001F600"}) ||
		!slices.Equal(second.GetAddedLines(), []string{"Likes detailed answers \U0001F600"}) {
		t.Fatalf("second rewrite diff: %v", second)
	}

	// The first etag is stale now.
	stale := rewrite("stale", memoriav1.Writer_WRITER_USER)
	stale.Etag = proto.String(block.GetEtag())
	_, err = c.blocks.RewriteMemoryBlock(ctx, stale)
	expectError(t, err, codes.Aborted, memoriav1.ErrorReason_ERROR_REASON_ETAG_MISMATCH)

	deleted, err := c.blocks.DeleteMemoryBlock(ctx, &memoriav1.DeleteMemoryBlockRequest{Writer: memoriav1.Writer_WRITER_USER})
	if err != nil {
		t.Fatal(err)
	}
	if !deleted.GetDeleted() || deleted.GetRemovedLineCount() != 3 {
		t.Fatalf("delete: %v", deleted)
	}
	gone, err := c.blocks.GetMemoryBlock(ctx, &memoriav1.GetMemoryBlockRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if gone.GetMemoryBlock().GetText() != "" || gone.GetMemoryBlock().GetEtag() != "" {
		t.Fatalf("after delete: %v", gone)
	}

	// Newest first: the delete, then the two rewrites, by their writers.
	events, err := c.audit.ListAuditEvents(ctx, &memoriav1.ListAuditEventsRequest{PageSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range events.GetEvents() {
		seen = append(seen, e.GetAction().String()+" "+e.GetWriter().String()+" "+e.GetPrincipalId())
	}
	want := []string{
		"AUDIT_ACTION_BLOCK_DELETED WRITER_USER ana",
		"AUDIT_ACTION_BLOCK_REWRITTEN WRITER_USER ana",
		"AUDIT_ACTION_BLOCK_REWRITTEN WRITER_MODEL ana",
	}
	if !slices.Equal(seen, want) || events.GetEvents()[0].GetRemovedLineCount() != 3 {
		t.Fatalf("audit events %q, want %q", seen, want)
	}
	deletes, err := c.audit.ListAuditEvents(ctx, &memoriav1.ListAuditEventsRequest{
		Actions: []memoriav1.AuditAction{memoriav1.AuditAction_AUDIT_ACTION_BLOCK_DELETED},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(deletes.GetEvents()) != 1 {
		t.Fatalf("%d delete events, want 1", len(deletes.GetEvents()))
	}
}

func TestOverLimitIsRefusedWithCounts(t *testing.T) {
	c := connect(t)
	ctx := as(t, "over")
	text := strings.Repeat("\U0001F600", limit+1) // 16,004 bytes; the server counts 4,001
	_, err := c.blocks.RewriteMemoryBlock(ctx, rewrite(text, memoriav1.Writer_WRITER_MODEL))
	info, fields := expectError(t, err, codes.InvalidArgument, memoriav1.ErrorReason_ERROR_REASON_BLOCK_TOO_LONG)
	if info.GetMetadata()["char_count"] != strconv.Itoa(limit+1) || info.GetMetadata()["char_limit"] != strconv.Itoa(limit) {
		t.Fatalf("metadata %v", info.GetMetadata())
	}
	if !slices.Equal(fields, []string{"text"}) {
		t.Fatalf("BadRequest fields %v", fields)
	}

	// Exactly at the limit is accepted, counted the same way.
	fits, err := c.blocks.RewriteMemoryBlock(ctx, rewrite(strings.Repeat("\U0001F600", limit), memoriav1.Writer_WRITER_MODEL))
	if err != nil {
		t.Fatal(err)
	}
	if fits.GetMemoryBlock().GetCharCount() != limit {
		t.Fatalf("char_count %d", fits.GetMemoryBlock().GetCharCount())
	}
}

func TestEmptyIsRefusedAndKeepsTheBlock(t *testing.T) {
	c := connect(t)
	ctx := as(t, "empty")
	if _, err := c.blocks.RewriteMemoryBlock(ctx, rewrite("keep me", memoriav1.Writer_WRITER_USER)); err != nil {
		t.Fatal(err)
	}
	_, err := c.blocks.RewriteMemoryBlock(ctx, rewrite(" \u200b\r\n\t\ufeff ", memoriav1.Writer_WRITER_MODEL))
	_, fields := expectError(t, err, codes.InvalidArgument, memoriav1.ErrorReason_ERROR_REASON_BLOCK_EMPTY)
	if !slices.Equal(fields, []string{"text"}) {
		t.Fatalf("BadRequest fields %v", fields)
	}
	got, err := c.blocks.GetMemoryBlock(ctx, &memoriav1.GetMemoryBlockRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetMemoryBlock().GetText() != "keep me" {
		t.Fatalf("stored block changed: %v", got)
	}
}

func TestMissingWriterNamesTheField(t *testing.T) {
	c := connect(t)
	_, err := c.blocks.RewriteMemoryBlock(as(t, "nowriter"), &memoriav1.RewriteMemoryBlockRequest{Text: "x"})
	_, fields := expectError(t, err, codes.InvalidArgument, memoriav1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
	if !slices.Equal(fields, []string{"writer"}) {
		t.Fatalf("BadRequest fields %v", fields)
	}
}

func TestNoIdentityIsUnauthenticated(t *testing.T) {
	c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.blocks.GetMemoryBlock(ctx, &memoriav1.GetMemoryBlockRequest{})
	expectError(t, err, codes.Unauthenticated, memoriav1.ErrorReason_ERROR_REASON_UNAUTHENTICATED)
}

func TestServerCountsEveryVectorAsTheHelper(t *testing.T) {
	// Ties the helper to the live server, not only to the file: what the server stores and
	// counts (or refuses) for each input is what the helper predicted.
	c := connect(t)
	ctx := as(t, "vectors")
	for _, v := range loadVectors(t).Cases {
		input := string(v.Input)
		resp, err := c.blocks.RewriteMemoryBlock(ctx, rewrite(input, memoriav1.Writer_WRITER_USER))
		switch {
		case v.Empty:
			expectError(t, err, codes.InvalidArgument, memoriav1.ErrorReason_ERROR_REASON_BLOCK_EMPTY)
		case v.OverLimit:
			info, _ := expectError(t, err, codes.InvalidArgument, memoriav1.ErrorReason_ERROR_REASON_BLOCK_TOO_LONG)
			if info.GetMetadata()["char_count"] != strconv.Itoa(CharCount(input)) {
				t.Errorf("%s: server counts %s, helper %d", v.Name, info.GetMetadata()["char_count"], CharCount(input))
			}
		case err != nil:
			t.Fatalf("%s: %v", v.Name, err)
		default:
			b := resp.GetMemoryBlock()
			if b.GetText() != Sanitize(input) || int(b.GetCharCount()) != CharCount(input) {
				t.Errorf("%s: server %+q (%d), helper %+q (%d)", v.Name, b.GetText(), b.GetCharCount(), Sanitize(input), CharCount(input))
			}
		}
	}
}

func TestSearchFindsIndexedTurn(t *testing.T) {
	c := connect(t)
	ctx := as(t, "searcher")
	token := "acct-" + randomHex(3)
	conversation := "c-" + randomHex(8)
	indexed, err := c.search.IndexTurn(ctx, &memoriav1.IndexTurnRequest{
		ConversationId: conversation,
		TurnId:         "t1",
		Question:       "Which account did I open for the invoices? It was " + token + ".",
		Answer:         "You opened " + token + " for the invoices.",
		TurnTime:       timestamppb.Now(),
		Wait:           true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if indexed.GetOutcome() != memoriav1.IndexTurnOutcome_INDEX_TURN_OUTCOME_INDEXED || indexed.GetChunkCount() != 1 {
		t.Fatalf("index: %v", indexed)
	}
	found, err := c.search.SearchConversations(ctx, &memoriav1.SearchConversationsRequest{Query: token, PageSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(found.GetHits()) == 0 {
		t.Fatal("the indexed turn is not found")
	}
	hit := found.GetHits()[0]
	if hit.GetConversationId() != conversation || hit.GetTurnId() != "t1" ||
		!strings.Contains(hit.GetText(), token) || hit.GetKeywordRank() < 1 || hit.GetScore() <= 0 {
		t.Fatalf("best hit: %v", hit)
	}
	// Another principal of the same tenant finds nothing of it.
	other, err := c.search.SearchConversations(as(t, "someone-else"), &memoriav1.SearchConversationsRequest{Query: token})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range other.GetHits() {
		if h.GetConversationId() == conversation {
			t.Fatalf("another principal found %v", h)
		}
	}
}
