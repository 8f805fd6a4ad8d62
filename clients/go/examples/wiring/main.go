// The Go wiring of clients/go/README.md, run against a real server with a scripted model in
// place of a provider's SDK (no network): the model saves a line, reads the server's words, and
// answers; the program then checks what the model read and that GetTurnInspection shows the
// turn's render and write. It exits non-zero when anything differs.
//
//	cd clients/go && MEMORIA_SERVER=127.0.0.1:50051 go run ./examples/wiring
//
// scripts/test-clients.sh runs it against its server, and tests/unit/test_client_readme.py
// checks that the README shows exactly the lines between the two "README wiring" markers.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	memoria "memoria/clients/go"
	memoriav1 "memoria/generated/go/memoria/v1"
)

// Message is one chat message as a provider's SDK holds it (OpenAI Chat Completions' shape).
type Message struct {
	Role, Content, ToolCallID string
	ToolCalls                 []ToolCall
}

// ToolCall is one tool call of the model: its id, the tool's name and the JSON arguments.
type ToolCall struct{ ID, Name, Arguments string }

// Model stands for a provider's SDK client.
type Model interface {
	Complete(ctx context.Context, messages []Message, tools []map[string]any) Message
}

// README wiring: begin
func connect(ctx context.Context, server, tenant, principal string) (*memoria.Adapter, error) {
	conn, err := grpc.NewClient(server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return memoria.NewAdapter(ctx, conn, "x-memoria-tenant", tenant, "x-memoria-principal", principal)
}

func answer(ctx context.Context, memory *memoria.Adapter, llm Model, conversationID, turnID, question string) (string, error) {
	memory.StartTurn(conversationID, turnID)
	section, err := memory.PromptSection(ctx)
	if err != nil {
		return "", err
	}
	messages := []Message{{Role: "system", Content: "You are a helpful assistant.\n\n" + section}, {Role: "user", Content: question}}
	for {
		reply := llm.Complete(ctx, messages, memory.Tools(memoria.OpenAIChatCompletions))
		messages = append(messages, reply)
		if len(reply.ToolCalls) == 0 {
			return reply.Content, memory.FinishTurn(question, reply.Content)
		}
		for _, call := range reply.ToolCalls {
			result, err := memory.ExecuteToolCall(ctx, call.Name, call.Arguments)
			if err != nil {
				return "", err
			}
			messages = append(messages, Message{Role: "tool", ToolCallID: call.ID, Content: result.Text})
		}
	}
}

// README wiring: end

// scripted plays the model: it saves the person's name, then answers.
type scripted struct {
	system, toolResult string
	toolCount          int
}

func (s *scripted) Complete(ctx context.Context, messages []Message, tools []map[string]any) Message {
	last := messages[len(messages)-1]
	if last.Role == "user" {
		s.system, s.toolCount = messages[0].Content, len(tools)
		arguments, _ := json.Marshal(map[string]string{"text": "Preferred name: Ana"})
		return Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Name: "memory_rewrite", Arguments: string(arguments)}}}
	}
	s.toolResult = last.Content
	return Message{Role: "assistant", Content: "Noted, Ana."}
}

func main() {
	server := os.Getenv("MEMORIA_SERVER")
	if server == "" {
		server = os.Getenv("MEMORIA_ADDR")
	}
	if server == "" {
		server = "127.0.0.1:50051"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	random := make([]byte, 4)
	if _, err := rand.Read(random); err != nil {
		log.Fatal(err)
	}
	tenant := "wiring-go-" + hex.EncodeToString(random)
	memory, err := connect(ctx, server, tenant, "ana")
	if err != nil {
		log.Fatal(err)
	}
	model := &scripted{}
	reply, err := answer(ctx, memory, model, "conv-1", "1", "Call me Ana.")
	if err != nil {
		log.Fatal(err)
	}
	if failed := memory.Flush(); failed != 0 {
		log.Fatalf("%d finished turns were not accepted", failed)
	}
	fail := func(format string, args ...any) { log.Fatalf("the wiring misbehaved: "+format, args...) }
	if reply != "Noted, Ana." || model.toolCount != 2 {
		fail("reply %q, %d tools", reply, model.toolCount)
	}
	if !strings.HasSuffix(model.system, "Personal memory: empty (nothing is remembered about this person yet).") {
		fail("system prompt %q", model.system)
	}
	if !strings.HasPrefix(model.toolResult, "Saved.") || !strings.Contains(model.toolResult, "\n+ Preferred name: Ana\n") {
		fail("the model read %q", model.toolResult)
	}
	conn, err := grpc.NewClient(server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	as := metadata.AppendToOutgoingContext(ctx, "x-memoria-tenant", tenant, "x-memoria-principal", "ana")
	inspected, err := memoriav1.NewConversationSearchServiceClient(conn).GetTurnInspection(as,
		&memoriav1.GetTurnInspectionRequest{Turn: &memoriav1.TurnReference{ConversationId: "conv-1", TurnId: "1"}})
	if err != nil {
		log.Fatal(err)
	}
	turn := inspected.GetInspection()
	if len(turn.GetRenders()) != 1 || len(turn.GetWrites()) != 1 || turn.GetWrites()[0].GetAddedLines()[0] != "Preferred name: Ana" {
		fail("the turn's inspection: %v", turn)
	}
	fmt.Println("ok Go wiring: the model saved a line, read the server's words and answered; the turn shows its render and write")
}
