package memoria

// The model's tools (tools/*.json, rendered from tools/memoria_tools.json) as a Go agent
// loads them: every provider shape names the same two tools with the same parameters, and a
// tool call the model makes, given as the JSON arguments string providers hand over, runs
// against the live server (MEMORIA_SERVER) as the RPC it stands for.

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	memoriav1 "memoria/generated/go/memoria/v1"
)

// tool is one tool of a provider file, reduced to what every shape carries.
type tool struct {
	Description string
	Parameters  map[string]any
}

// loadTools reads tools/<file> and returns its tools by name. shape says where the name,
// description and JSON Schema sit: "chat" (OpenAI Chat Completions: {"type": "function",
// "function": {...}}), "responses" (OpenAI Responses: flat, "parameters") or "anthropic"
// (Anthropic Messages: flat, "input_schema").
func loadTools(t *testing.T, file, shape string) map[string]tool {
	t.Helper()
	data, err := os.ReadFile("../../tools/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var entries []map[string]any
	if err := json.Unmarshal(data, &entries); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	tools := map[string]tool{}
	for _, e := range entries {
		schemaKey := "parameters"
		switch shape {
		case "chat":
			if e["type"] != "function" {
				t.Fatalf("%s: entry type %v, want function", file, e["type"])
			}
			e, _ = e["function"].(map[string]any)
		case "responses":
			if e["type"] != "function" {
				t.Fatalf("%s: entry type %v, want function", file, e["type"])
			}
		case "anthropic":
			schemaKey = "input_schema"
		}
		name, _ := e["name"].(string)
		description, _ := e["description"].(string)
		params, _ := e[schemaKey].(map[string]any)
		if name == "" || description == "" || params == nil {
			t.Fatalf("%s: an entry without name, description or %s: %v", file, schemaKey, e)
		}
		tools[name] = tool{description, params}
	}
	return tools
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestToolFilesAgreeAndDeclareTheArguments(t *testing.T) {
	chat := loadTools(t, "openai_chat_completions.json", "chat")
	for file, shape := range map[string]string{"openai_responses.json": "responses", "anthropic_messages.json": "anthropic"} {
		if other := loadTools(t, file, shape); !reflect.DeepEqual(other, chat) {
			t.Errorf("%s differs from openai_chat_completions.json", file)
		}
	}
	names := make([]string, 0, len(chat))
	for name := range chat {
		names = append(names, name)
	}
	sort.Strings(names)
	if !slices.Equal(names, []string{"conversation_search", "memory_rewrite"}) {
		t.Fatalf("tools %v", names)
	}
	for name, want := range map[string]struct{ properties, required []string }{
		"memory_rewrite":      {[]string{"text"}, []string{"text"}},
		"conversation_search": {[]string{"conversation_id", "end_time", "max_turns", "query", "start_time"}, []string{"query"}},
	} {
		p := chat[name].Parameters
		props, _ := p["properties"].(map[string]any)
		var required []string
		for _, r := range p["required"].([]any) {
			required = append(required, r.(string))
		}
		if p["type"] != "object" || p["additionalProperties"] != false ||
			!slices.Equal(keys(props), want.properties) || !slices.Equal(required, want.required) {
			t.Errorf("%s parameters: %v", name, p)
		}
	}
	rewrite := chat["memory_rewrite"]
	if !strings.Contains(rewrite.Description, "entire block") {
		t.Errorf("memory_rewrite does not ask for the entire block: %q", rewrite.Description)
	}
	maxTurns := chat["conversation_search"].Parameters["properties"].(map[string]any)["max_turns"].(map[string]any)
	if maxTurns["type"] != "integer" || maxTurns["minimum"] != 1.0 || maxTurns["maximum"] != 50.0 {
		t.Errorf("max_turns: %v", maxTurns)
	}
	for _, bound := range []string{"start_time", "end_time"} {
		p := chat["conversation_search"].Parameters["properties"].(map[string]any)[bound].(map[string]any)
		if p["type"] != "string" || p["pattern"] == nil {
			t.Errorf("%s: %v", bound, p)
		}
	}
}

// decodeArguments parses a tool call's JSON arguments strictly, as a careful agent does
// before calling anything: an argument the schema does not declare is an error.
func decodeArguments(arguments string, into any) error {
	dec := json.NewDecoder(bytes.NewReader([]byte(arguments)))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

func TestToolCallsRunAgainstTheServer(t *testing.T) {
	c := connect(t)
	ctx := as(t, "tool-caller")
	token := "acct-" + randomHex(3)

	// memory_rewrite, as the model sends it: the whole block in "text".
	call := `{"text": "Preferred name: Ana\nUses billing account ` + token + `"}`
	var rewriteArgs struct {
		Text *string `json:"text"`
	}
	if err := decodeArguments(call, &rewriteArgs); err != nil || rewriteArgs.Text == nil {
		t.Fatalf("memory_rewrite arguments %s: %v", call, err)
	}
	saved, err := c.blocks.RewriteMemoryBlock(ctx, rewrite(*rewriteArgs.Text, memoriav1.Writer_WRITER_MODEL))
	if err != nil {
		t.Fatal(err)
	}
	wantAdded := []string{"Preferred name: Ana", "Uses billing account " + token}
	if !slices.Equal(saved.GetAddedLines(), wantAdded) || len(saved.GetRemovedLines()) != 0 ||
		int(saved.GetMemoryBlock().GetCharCount()) != CharCount(*rewriteArgs.Text) {
		t.Fatalf("rewrite: %v", saved)
	}
	// conversation_search after a turn that mentions the account: max_turns is page_size.
	conversation := "c-" + randomHex(8)
	if _, err := c.search.IndexTurn(ctx, &memoriav1.IndexTurnRequest{
		ConversationId: conversation, TurnId: "t1", Question: "Where did the refund go?",
		Answer: "It went to " + token + ".", TurnTime: timestamppb.Now(), Wait: true,
	}); err != nil {
		t.Fatal(err)
	}
	var searchArgs struct {
		Query    *string `json:"query"`
		MaxTurns *int32  `json:"max_turns"`
	}
	args := `{"query": "` + token + `", "max_turns": 3}`
	if err := decodeArguments(args, &searchArgs); err != nil || searchArgs.Query == nil || searchArgs.MaxTurns == nil {
		t.Fatalf("conversation_search arguments %s: %v", args, err)
	}
	found, err := c.search.SearchConversations(ctx, &memoriav1.SearchConversationsRequest{
		Query: *searchArgs.Query, PageSize: *searchArgs.MaxTurns})
	if err != nil {
		t.Fatal(err)
	}
	hits := found.GetHits()
	if len(hits) == 0 || len(hits) > 3 || hits[0].GetConversationId() != conversation ||
		!strings.Contains(hits[0].GetText(), token) {
		t.Fatalf("search: %v", hits)
	}
}
