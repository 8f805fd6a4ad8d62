package memoriamcp_test

// The MCP integration against a running Memoria server (MEMORIA_SERVER, started by
// scripts/test-clients.sh; without it the tests fail). An agent loop takes its tools from an
// MCP client session connected to the SDK's server through the SDK's in-memory transports; a
// scripted model (the SDK has no model of its own) asks for memory_rewrite, reads the result,
// and answers. What it must read comes from the cross-language conformance data
// (tests/conformance/model_turn.json); the test then checks the saved block and what
// GetTurnInspection recorded for the turn.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	memoria "memoria/clients/go"
	memoriav1 "memoria/generated/go/memoria/v1"
	memoriamcp "memoria/integrations/go-mcp"
)

const (
	base     = "You are a helpful assistant."
	question = "Call me Ana, and my Jira account is acct-7731."
	answer   = "Noted, Ana."
)

// step is one step of the conformance data, the fields these tests read.
type step struct {
	Name      string          `json:"name"`
	Turn      []string        `json:"turn"`
	ToolName  string          `json:"tool_name"`
	Arguments json.RawMessage `json:"arguments"`
	Expect    struct {
		Text              string `json:"text"`
		IsError           bool   `json:"is_error"`
		AfterInstructions string `json:"after_instructions"`
	} `json:"expect"`
}

func conformance(t *testing.T, name string) step {
	t.Helper()
	raw, err := os.ReadFile("../../tests/conformance/model_turn.json")
	if err != nil {
		t.Fatal(err)
	}
	var data struct{ Steps []step }
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(data.Steps, func(s step) bool { return s.Name == name })
	if i < 0 {
		t.Fatalf("no step %q in the conformance data", name)
	}
	return data.Steps[i]
}

// Message and ToolCall are a chat as a provider's SDK holds it.
type Message struct {
	Role, Content, ToolCallID string
	ToolCalls                 []ToolCall
}

type ToolCall struct{ ID, Name, Arguments string }

// scriptedModel writes the block on its first call and answers once it has read a result.
type scriptedModel struct {
	rewrite string
	systems []string
	results []string
	tools   []string
}

func (m *scriptedModel) Complete(system string, messages []Message, tools []*mcp.Tool) Message {
	m.systems = append(m.systems, system)
	m.tools = m.tools[:0]
	for _, t := range tools {
		m.tools = append(m.tools, t.Name)
	}
	for _, msg := range messages {
		if msg.Role == "tool" {
			m.results = append(m.results, msg.Content)
			return Message{Role: "assistant", Content: answer}
		}
	}
	return Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "call-1", Name: "memory_rewrite", Arguments: m.rewrite}}}
}

type fixture struct {
	memory   *memoria.Adapter
	session  *mcp.ClientSession
	conn     *grpc.ClientConn
	identity metadata.MD
}

// setUp connects a fresh person's adapter to the server, serves its tools with the SDK and
// connects an MCP client to them in memory.
func setUp(t *testing.T, ctx context.Context) fixture {
	t.Helper()
	addr := os.Getenv("MEMORIA_SERVER")
	if addr == "" {
		t.Fatal("MEMORIA_SERVER is not set: scripts/test-clients.sh starts the server and sets it")
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	tenant := "go-mcp-" + rand.Text()[:12]
	identity := []string{"x-memoria-tenant", strings.ToLower(tenant), "x-memoria-principal", "ana"}
	memory, err := memoria.NewAdapter(ctx, conn, identity...)
	if err != nil {
		t.Fatal(err)
	}

	session, err := serve(ctx, memory)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { session.Close() })
	return fixture{memory, session, conn, metadata.Pairs(identity...)}
}

// serve is the README's wiring (integrations/go-mcp/README.md): memory's tools on an MCP server,
// and an MCP client session connected to it in memory, on the agent's side.
func serve(ctx context.Context, memory *memoria.Adapter) (*mcp.ClientSession, error) {
	// README wiring: begin
	server := mcp.NewServer(&mcp.Implementation{Name: "memoria", Version: "0.1.0"}, nil)
	memoriamcp.AddTools(server, memory)
	serverEnd, clientEnd := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, serverEnd, nil); err != nil {
		return nil, err
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "0.1.0"}, nil)
	session, err := client.Connect(ctx, clientEnd, nil)
	// README wiring: end
	return session, err
}

// answerTurn is the README's loop: the section last in the system prompt before each model
// call, the model's tool calls through the MCP session, the turn finished after the answer.
func answerTurn(ctx context.Context, memory *memoria.Adapter, session *mcp.ClientSession, llm *scriptedModel, conversationID, turnID, question string) (string, error) {
	memory.StartTurn(conversationID, turnID)
	tools, err := session.ListTools(ctx, nil)
	if err != nil {
		return "", err
	}
	messages := []Message{{Role: "user", Content: question}}
	for {
		section, err := memory.PromptSection(ctx)
		if err != nil {
			return "", err
		}
		reply := llm.Complete(base+"\n\n"+section, messages, tools.Tools)
		messages = append(messages, reply)
		if len(reply.ToolCalls) == 0 {
			return reply.Content, memory.FinishTurn(question, reply.Content)
		}
		for _, call := range reply.ToolCalls {
			result, err := session.CallTool(ctx, &mcp.CallToolParams{Name: call.Name, Arguments: json.RawMessage(call.Arguments)})
			if err != nil {
				return "", err
			}
			text := result.Content[0].(*mcp.TextContent).Text
			messages = append(messages, Message{Role: "tool", ToolCallID: call.ID, Content: text})
		}
	}
}

func TestAnAgentOverMCPSavesTheBlockAndReadsTheServersWords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := setUp(t, ctx)
	write := conformance(t, "saved: two lines added")
	emptyBlock := conformance(t, "a first turn's section: nothing remembered yet").Expect.AfterInstructions
	var arguments struct{ Text string }
	if err := json.Unmarshal(write.Arguments, &arguments); err != nil {
		t.Fatal(err)
	}
	llm := &scriptedModel{rewrite: string(write.Arguments)}

	got, err := answerTurn(ctx, f.memory, f.session, llm, write.Turn[0], write.Turn[1], question)
	if err != nil {
		t.Fatal(err)
	}
	if got != answer {
		t.Errorf("answer %q", got)
	}
	// The SDK lists tools by name.
	if want := []string{"conversation_search", "memory_rewrite"}; !slices.Equal(llm.tools, want) {
		t.Errorf("tools over MCP %v, want %v", llm.tools, want)
	}
	if len(llm.systems) != 2 || !strings.HasPrefix(llm.systems[0], base+"\n\n") ||
		!strings.HasSuffix(llm.systems[0], emptyBlock) || !strings.HasSuffix(llm.systems[1], arguments.Text) {
		t.Errorf("system prompts %q", llm.systems)
	}
	if !slices.Equal(llm.results, []string{write.Expect.Text}) {
		t.Errorf("the model read %q, want %q", llm.results, write.Expect.Text)
	}
	if failed := f.memory.Flush(); failed != 0 {
		t.Errorf("%d finished turns were not accepted", failed)
	}
	if _, err := f.memory.PromptSection(ctx); !errors.Is(err, memoria.ErrNoTurn) {
		t.Errorf("after FinishTurn the turn is over; PromptSection gave %v", err)
	}

	ctx = metadata.NewOutgoingContext(ctx, f.identity)
	stored, err := memoriav1.NewMemoryBlockServiceClient(f.conn).GetMemoryBlock(ctx, &memoriav1.GetMemoryBlockRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if stored.GetMemoryBlock().GetText() != arguments.Text {
		t.Errorf("stored block %q", stored.GetMemoryBlock().GetText())
	}
	turn := &memoriav1.TurnReference{ConversationId: write.Turn[0], TurnId: write.Turn[1]}
	response, err := memoriav1.NewConversationSearchServiceClient(f.conn).GetTurnInspection(ctx, &memoriav1.GetTurnInspectionRequest{Turn: turn})
	if err != nil {
		t.Fatal(err)
	}
	inspection := response.GetInspection()
	if len(inspection.GetRenders()) != 2 || inspection.GetRenders()[0].GetCharCount() != 0 {
		t.Errorf("renders %v", inspection.GetRenders())
	}
	writes := inspection.GetWrites()
	if len(writes) != 1 || writes[0].GetWriter() != memoriav1.Writer_WRITER_MODEL || len(writes[0].GetRemovedLines()) != 0 ||
		!slices.Equal(writes[0].GetAddedLines(), strings.Split(arguments.Text, "\n")) {
		t.Errorf("writes %v", writes)
	}
	if inspection.GetFailedWriteCount() != 0 {
		t.Errorf("failed writes %d", inspection.GetFailedWriteCount())
	}
}

func TestACallTheServerRefusesIsAnMCPError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := setUp(t, ctx)
	s := conformance(t, "search: an extra argument")
	f.memory.StartTurn(s.Turn[0], s.Turn[1])
	result, err := f.session.CallTool(ctx, &mcp.CallToolParams{Name: s.ToolName, Arguments: s.Arguments})
	if err != nil {
		t.Fatal(err)
	}
	if text := result.Content[0].(*mcp.TextContent).Text; !result.IsError || text != s.Expect.Text {
		t.Errorf("got (%q, isError %v), want (%q, true)", text, result.IsError, s.Expect.Text)
	}
}
