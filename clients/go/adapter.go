package memoria

// The turn adapter: a thin layer over the server's ModelToolService, the same small API as the
// Python and TypeScript adapters. Every word the model reads comes from the server (the checks,
// the wording and the per-turn cap of failed writes live there); the words for a server that
// cannot be reached are fetched with the tools when the adapter is made. Every render, search
// and write names the turn, so GetTurnInspection shows what each turn read and wrote.

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	memoriav1 "memoria/generated/go/memoria/v1"
)

// Shape is a provider's shape of the tools list.
type Shape string

// The shapes Tools renders.
const (
	OpenAIChatCompletions Shape = "openai_chat_completions"
	OpenAIResponses       Shape = "openai_responses"
	AnthropicMessages     Shape = "anthropic_messages"
)

// DefaultTimeout bounds each call the adapter makes.
const DefaultTimeout = 10 * time.Second

const rewriteTool = "memory_rewrite"

// ErrNoTurn is returned by a call made outside a turn: call StartTurn first.
var ErrNoTurn = errors.New("memoria: no turn: call StartTurn(conversationID, turnID) first")

// ToolResult is what a tool call returns: Text is exactly what the model reads; IsError marks a
// call that did not do what was asked (Anthropic's tool_result is_error, MCP's isError).
type ToolResult struct {
	Text    string
	IsError bool
}

// Adapter gives one person's conversation Memoria's tools and prompt section, turn after turn.
// Its methods may be called from several goroutines (parallel tool calls of one turn).
type Adapter struct {
	tools    memoriav1.ModelToolServiceClient
	search   memoriav1.ConversationSearchServiceClient
	identity []string
	model    *memoriav1.GetModelToolsResponse
	// Timeout bounds each call; DefaultTimeout unless changed before the first turn.
	Timeout time.Duration

	mu      sync.Mutex
	turn    *memoriav1.TurnReference
	unseen  bool // this turn's section could not show the block: rewrites are refused
	pending sync.WaitGroup
	failed  int // finished turns not accepted since the last Flush
}

// NewAdapter fetches the model's tools (GetModelTools) and returns an adapter acting for the
// person that identity names: metadata key-value pairs sent with every call, for example
// "authorization", "Bearer <jwt>", or the trusted headers "x-memoria-tenant", "acme",
// "x-memoria-principal", "ana". It fails like any call when the server cannot be reached.
func NewAdapter(ctx context.Context, conn grpc.ClientConnInterface, identity ...string) (*Adapter, error) {
	a := &Adapter{
		tools:    memoriav1.NewModelToolServiceClient(conn),
		search:   memoriav1.NewConversationSearchServiceClient(conn),
		identity: identity,
		Timeout:  DefaultTimeout,
	}
	ctx, cancel := a.call(ctx)
	defer cancel()
	model, err := a.tools.GetModelTools(ctx, &memoriav1.GetModelToolsRequest{})
	if err != nil {
		return nil, err
	}
	a.model = model
	return a, nil
}

// ForIdentity returns an adapter for another person (or conversation) sharing this one's
// fetched tools, without a call.
func (a *Adapter) ForIdentity(identity ...string) *Adapter {
	return &Adapter{tools: a.tools, search: a.search, identity: identity, model: a.model, Timeout: a.Timeout}
}

// ModelTools is the server's GetModelTools answer the adapter was made with.
func (a *Adapter) ModelTools() *memoriav1.GetModelToolsResponse { return a.model }

// Tools returns the tools list to send to a provider, in its shape, ready for encoding/json.
func (a *Adapter) Tools(shape Shape) []map[string]any {
	var out []map[string]any
	for _, t := range a.model.GetTools() {
		var parameters map[string]any
		if err := json.Unmarshal([]byte(t.GetParametersJsonSchema()), &parameters); err != nil {
			panic("memoria: the server sent a tool schema that is not JSON: " + err.Error())
		}
		switch shape {
		case OpenAIChatCompletions:
			out = append(out, map[string]any{"type": "function", "function": map[string]any{
				"name": t.GetName(), "description": t.GetDescription(),
				"parameters": parameters, "strict": strictCompatible(parameters)}})
		case OpenAIResponses:
			out = append(out, map[string]any{"type": "function", "name": t.GetName(),
				"description": t.GetDescription(), "parameters": parameters,
				"strict": strictCompatible(parameters)})
		case AnthropicMessages:
			out = append(out, map[string]any{"name": t.GetName(),
				"description": t.GetDescription(), "input_schema": parameters})
		default:
			panic("memoria: unknown tool shape " + string(shape))
		}
	}
	return out
}

// strictCompatible reports whether OpenAI's strict mode accepts the schema (every property
// required, no others); otherwise the tool is sent with strict false, explicitly, as the
// Responses API defaults to strict.
func strictCompatible(parameters map[string]any) bool {
	properties, _ := parameters["properties"].(map[string]any)
	required, _ := parameters["required"].([]any)
	if parameters["additionalProperties"] != false || len(required) != len(properties) {
		return false
	}
	for _, name := range required {
		if _, ok := properties[name.(string)]; !ok {
			return false
		}
	}
	return true
}

// StartTurn starts a turn: every render, tool call and the finished turn carry these ids.
func (a *Adapter) StartTurn(conversationID, turnID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.turn = &memoriav1.TurnReference{ConversationId: conversationID, TurnId: turnID}
	a.unseen = false
}

func (a *Adapter) current() (*memoriav1.TurnReference, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.turn == nil {
		return nil, false, ErrNoTurn
	}
	return a.turn, a.unseen, nil
}

func (a *Adapter) call(ctx context.Context) (context.Context, context.CancelFunc) {
	if len(a.identity) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, a.identity...)
	}
	return context.WithTimeout(ctx, a.Timeout)
}

// PromptSection returns the memory part of the system prompt, to put last in it: the
// instructions, then the block. If the server cannot render it, it is the server's words for
// that (fetched with the tools), and memory writes are refused without a call for the rest of
// the turn, as a whole rewrite would replace a block the model has not seen. The error is only
// ErrNoTurn.
func (a *Adapter) PromptSection(ctx context.Context) (string, error) {
	turn, _, err := a.current()
	if err != nil {
		return "", err
	}
	ctx, cancel := a.call(ctx)
	defer cancel()
	response, err := a.tools.RenderPromptSection(ctx, &memoriav1.RenderPromptSectionRequest{Turn: turn})
	a.mu.Lock()
	a.unseen = err != nil
	a.mu.Unlock()
	if err != nil {
		log.Printf("memoria: RenderPromptSection failed: %v", status.Code(err))
		return a.model.GetUnavailablePromptSection(), nil
	}
	return response.GetPromptSection(), nil
}

// ExecuteToolCall runs one tool call exactly as the model produced it (its name and JSON
// arguments) and returns what the model reads. The error is only the backend's own mistake:
// ErrNoTurn, or the server's INVALID_ARGUMENT (invalid turn ids).
func (a *Adapter) ExecuteToolCall(ctx context.Context, name, argumentsJSON string) (ToolResult, error) {
	turn, unseen, err := a.current()
	if err != nil {
		return ToolResult{}, err
	}
	if name == rewriteTool && unseen {
		return ToolResult{a.model.GetRewriteRefusedUnseenText(), true}, nil
	}
	ctx, cancel := a.call(ctx)
	defer cancel()
	response, err := a.tools.ExecuteToolCall(ctx, &memoriav1.ExecuteToolCallRequest{
		Turn: turn, ToolName: name, ArgumentsJson: argumentsJSON})
	if err == nil {
		return ToolResult{response.GetText(), response.GetIsError()}, nil
	}
	st := status.Convert(err)
	for _, detail := range st.Details() {
		if words, ok := detail.(*errdetails.LocalizedMessage); ok {
			return ToolResult{words.GetMessage(), true}, nil // the server's words for the model
		}
	}
	if st.Code() != codes.InvalidArgument {
		for _, tool := range a.model.GetTools() {
			if tool.GetName() == name {
				log.Printf("memoria: ExecuteToolCall %s got no answer: %v", name, st.Code())
				return ToolResult{tool.GetUnreachableText(), true}, nil
			}
		}
	}
	return ToolResult{}, err
}

// FinishTurn sends the finished turn to conversation search without waiting (the server
// accepts it durably and indexes it shortly after); the turn ends. A failure is logged, as the
// answer has already been given; Flush waits for the turns still in flight.
func (a *Adapter) FinishTurn(question, answer string) error {
	a.mu.Lock()
	turn := a.turn
	a.turn = nil
	a.mu.Unlock()
	if turn == nil {
		return ErrNoTurn
	}
	request := &memoriav1.IndexTurnRequest{ConversationId: turn.GetConversationId(),
		TurnId: turn.GetTurnId(), Question: question, Answer: answer, TurnTime: timestamppb.Now()}
	a.pending.Add(1)
	go func() {
		defer a.pending.Done()
		ctx, cancel := a.call(context.Background())
		defer cancel()
		if _, err := a.search.IndexTurn(ctx, request); err != nil {
			log.Printf("memoria: IndexTurn failed: %v", status.Code(err))
			a.mu.Lock()
			a.failed++
			a.mu.Unlock()
		}
	}()
	return nil
}

// Flush waits for the turns sent by FinishTurn and returns how many were not accepted since
// the last Flush (for a process about to exit).
func (a *Adapter) Flush() int {
	a.pending.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	failed := a.failed
	a.failed = 0
	return failed
}
