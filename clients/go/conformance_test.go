package memoria

// The scripted model turn, tests/conformance/model_turn.json, played through the Go adapter
// against the live server, as tests/conformance/adapter_turn.py plays it through the Python one
// (its docstring says how each step is played): the tools in every shape, the prompt section
// and each tool call's exact text through the adapter's API; the steps that are not the model's
// side (IndexTurn with wait, UpdateMemorySettings, GetTurnInspection) through the raw stubs.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	memoriav1 "memoria/generated/go/memoria/v1"
)

type conformanceStep struct {
	Name          string          `json:"name"`
	Call          string          `json:"call"`
	Turn          []string        `json:"turn"`
	ToolName      string          `json:"tool_name"`
	Arguments     json.RawMessage `json:"arguments"`
	ArgumentsJSON *string         `json:"arguments_json"`
	Identity      string          `json:"identity"`
	OmitTurn      bool            `json:"omit_turn"`
	Expect        map[string]any  `json:"expect"`
	// IndexTurn and UpdateMemorySettings.
	ConversationID string `json:"conversation_id"`
	TurnID         string `json:"turn_id"`
	Question       string `json:"question"`
	Answer         string `json:"answer"`
	TurnTime       string `json:"turn_time"`
	MemoryEnabled  bool   `json:"memory_enabled"`
}

type conformanceData struct {
	ToolsFile        string            `json:"tools_file"`
	InstructionsFile string            `json:"instructions_file"`
	Steps            []conformanceStep `json:"steps"`
}

func readRepoFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile("../../" + path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// compactJSON is the data's arguments object as compact JSON text, its keys in the data's
// order (as the Python runner sends it; escapes may differ, the JSON value cannot).
func compactJSON(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// fromShape reads a provider shape's tools back as {name, description, parameters}.
func fromShape(t *testing.T, tools []map[string]any, shape Shape) []map[string]any {
	t.Helper()
	data, err := json.Marshal(tools) // through JSON, as a provider would receive them
	if err != nil {
		t.Fatal(err)
	}
	var entries []map[string]any
	if err := json.Unmarshal(data, &entries); err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range entries {
		schema := "parameters"
		switch shape {
		case OpenAIChatCompletions:
			e = e["function"].(map[string]any)
		case AnthropicMessages:
			schema = "input_schema"
		}
		out = append(out, map[string]any{"name": e["name"], "description": e["description"], "parameters": e[schema]})
	}
	return out
}

func TestConformanceModelTurn(t *testing.T) {
	var data conformanceData
	if err := json.Unmarshal(readRepoFile(t, "tests/conformance/model_turn.json"), &data); err != nil {
		t.Fatal(err)
	}
	var source struct {
		Tools []map[string]any `json:"tools"`
	}
	if err := json.Unmarshal(readRepoFile(t, data.ToolsFile), &source); err != nil {
		t.Fatal(err)
	}
	instructions := strings.TrimSpace(string(readRepoFile(t, data.InstructionsFile)))

	conn := dial(t)
	identity := []string{"x-memoria-tenant", "conformance-go-" + randomHex(6), "x-memoria-principal", "ana"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adapter, err := NewAdapter(ctx, conn, identity...)
	if err != nil {
		t.Fatal(err)
	}
	adapter.Timeout = time.Minute
	raw := rawClients{memoriav1.NewMemoryBlockServiceClient(conn), memoriav1.NewConversationSearchServiceClient(conn)}
	as := metadata.AppendToOutgoingContext(ctx, identity...)
	var current []string
	inTurn := func(turn []string) {
		if !reflect.DeepEqual(turn, current) {
			adapter.StartTurn(turn[0], turn[1])
			current = turn
		}
	}
	if len(data.Steps) < 30 {
		t.Fatalf("only %d steps in the data", len(data.Steps))
	}
	for _, step := range data.Steps {
		check := func(what string, want, got any) {
			if !reflect.DeepEqual(want, got) {
				t.Errorf("%s: %s: expected %q, got %q", step.Name, what, want, got)
			}
		}
		switch step.Call {
		case "GetModelTools":
			for _, shape := range []Shape{OpenAIChatCompletions, OpenAIResponses, AnthropicMessages} {
				check(string(shape), source.Tools, fromShape(t, adapter.Tools(shape), shape))
			}
		case "RenderPromptSection":
			inTurn(step.Turn)
			section, err := adapter.PromptSection(ctx)
			if err != nil {
				t.Fatal(err)
			}
			check("prompt_section", instructions+"\n\n"+step.Expect["after_instructions"].(string), section)
		case "ExecuteToolCall":
			arguments := ""
			if step.ArgumentsJSON != nil {
				arguments = *step.ArgumentsJSON
			} else {
				arguments = compactJSON(t, step.Arguments)
			}
			if step.OmitTurn {
				_, err := adapter.ForIdentity(identity...).ExecuteToolCall(ctx, step.ToolName, arguments)
				check("a call without a turn", ErrNoTurn, err)
				continue
			}
			runner, wantText, wantError := adapter, step.Expect["text"], step.Expect["is_error"]
			if step.Identity == "none" {
				runner = adapter.ForIdentity()
				runner.StartTurn(step.Turn[0], step.Turn[1])
				wantText, wantError = step.Expect["localized_message"], true
			} else {
				inTurn(step.Turn)
			}
			result, err := runner.ExecuteToolCall(ctx, step.ToolName, arguments)
			if err != nil {
				t.Fatalf("%s: %v", step.Name, err)
			}
			check("text", wantText, result.Text)
			check("is_error", wantError, result.IsError)
		case "IndexTurn":
			when, err := time.Parse(time.RFC3339, step.TurnTime)
			if err != nil {
				t.Fatal(err)
			}
			response, err := raw.search.IndexTurn(as, &memoriav1.IndexTurnRequest{
				ConversationId: step.ConversationID, TurnId: step.TurnID, Question: step.Question,
				Answer: step.Answer, TurnTime: timestamppb.New(when), Wait: true})
			if err != nil {
				t.Fatal(err)
			}
			check("outcome", memoriav1.IndexTurnOutcome_INDEX_TURN_OUTCOME_INDEXED, response.GetOutcome())
		case "UpdateMemorySettings":
			if _, err := raw.blocks.UpdateMemorySettings(as, &memoriav1.UpdateMemorySettingsRequest{
				MemoryEnabled: &step.MemoryEnabled, Writer: memoriav1.Writer_WRITER_USER}); err != nil {
				t.Fatal(err)
			}
		case "GetTurnInspection":
			response, err := raw.search.GetTurnInspection(as, &memoriav1.GetTurnInspectionRequest{
				Turn: &memoriav1.TurnReference{ConversationId: step.Turn[0], TurnId: step.Turn[1]}})
			if err != nil {
				t.Fatal(err)
			}
			inspection := response.GetInspection()
			writes := []any{}
			for _, w := range inspection.GetWrites() {
				writes = append(writes, map[string]any{
					"removed_lines": toAny(w.GetRemovedLines()), "added_lines": toAny(w.GetAddedLines())})
			}
			check("writes", step.Expect["writes"], writes)
			check("failed_write_count", step.Expect["failed_write_count"], float64(inspection.GetFailedWriteCount()))
			check("renders", step.Expect["renders"], float64(len(inspection.GetRenders())))
			check("searches", step.Expect["searches"], float64(len(inspection.GetSearches())))
		default:
			t.Fatalf("%s: unknown call %q", step.Name, step.Call)
		}
	}
	if err := adapter.FinishTurn("The last question.", "The last answer."); err != nil {
		t.Fatal(err)
	}
	if failed := adapter.Flush(); failed != 0 {
		t.Fatalf("%d finished turns were not accepted", failed)
	}
	if err := adapter.FinishTurn("again", "again"); !errors.Is(err, ErrNoTurn) {
		t.Fatalf("a second FinishTurn: %v, want ErrNoTurn", err)
	}
}

func toAny(lines []string) []any {
	out := []any{}
	for _, line := range lines {
		out = append(out, line)
	}
	return out
}

// rawClients are the stubs for the steps that are not the model's side.
type rawClients struct {
	blocks memoriav1.MemoryBlockServiceClient
	search memoriav1.ConversationSearchServiceClient
}
