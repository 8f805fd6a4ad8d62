// Memoria from Go with the generated stubs: render the memory section, rewrite the block,
// index a finished turn (waiting until it is searchable), search for it, and read an error's
// google.rpc details.
//
//	cd examples/go && MEMORIA_SERVER=127.0.0.1:50051 go run .
//
// The server must trust the x-memoria-* headers (`memoria serve` on loopback does); with a
// Memoria in jwt mode send "authorization", "Bearer <jwt>" instead. scripts/test-clients.sh
// runs this program against its server, so it stays correct.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	memoriav1 "memoria/generated/go/memoria/v1"
)

func main() {
	addr := os.Getenv("MEMORIA_SERVER")
	if addr == "" {
		addr = "127.0.0.1:50051"
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	blocks := memoriav1.NewMemoryBlockServiceClient(conn)
	search := memoriav1.NewConversationSearchServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-memoria-tenant", "acme", "x-memoria-principal", "ana-go")

	// The model rewrites the whole block; the answer lists the lines it removed and added.
	saved, err := blocks.RewriteMemoryBlock(ctx, &memoriav1.RewriteMemoryBlockRequest{
		Text: "Preferred name: Ana\nUses Jira account ana-42", Writer: memoriav1.Writer_WRITER_MODEL})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("added:", saved.GetAddedLines(), "removed:", saved.GetRemovedLines())

	// Every turn: the section goes last in the system prompt.
	section, err := blocks.RenderMemoryBlock(ctx, &memoriav1.RenderMemoryBlockRequest{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(section.GetPromptSection())

	// An over-limit block is refused, never cut: the counts are in the ErrorInfo.
	_, err = blocks.RewriteMemoryBlock(ctx, &memoriav1.RewriteMemoryBlockRequest{
		Text: strings.Repeat("x", 4001), Writer: memoriav1.Writer_WRITER_MODEL})
	reason := ""
	if st, ok := status.FromError(err); err != nil && ok {
		for _, d := range st.Details() { // decoded from grpc-status-details-bin
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.GetReason()
				fmt.Println("refused:", reason, info.GetMetadata()["char_count"], "of", info.GetMetadata()["char_limit"])
			}
		}
	}

	// After the answer: send the finished turn (Wait: searchable when this returns).
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		log.Fatal(err)
	}
	conversation := "quickstart-" + hex.EncodeToString(suffix)
	indexed, err := search.IndexTurn(ctx, &memoriav1.IndexTurnRequest{
		ConversationId: conversation, TurnId: "1",
		Question: "Which account did the refund go to?", Answer: "To acct-4821, on 2026-11-02.",
		TurnTime: timestamppb.Now(), Wait: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("indexed:", indexed.GetOutcome())

	// Only when a question points back to an earlier conversation.
	found, err := search.SearchConversations(ctx, &memoriav1.SearchConversationsRequest{Query: "acct-4821", PageSize: 5})
	if err != nil {
		log.Fatal(err)
	}
	ours := false
	for _, hit := range found.GetHits() {
		fmt.Printf("%s/%s (keyword rank %d, semantic rank %d): %s\n", hit.GetConversationId(),
			hit.GetTurnId(), hit.GetKeywordRank(), hit.GetSemanticRank(), hit.GetText())
		ours = ours || hit.GetConversationId() == conversation
	}

	if !strings.HasSuffix(section.GetPromptSection(), "Uses Jira account ana-42") || !ours ||
		reason != "ERROR_REASON_BLOCK_TOO_LONG" {
		log.Fatal("quickstart: the section, the refusal or the search did not show what was expected")
	}
}
