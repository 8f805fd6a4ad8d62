// Package memoriamcp serves Memoria's two tools (memory_rewrite, conversation_search) on a
// server of the official MCP Go SDK (github.com/modelcontextprotocol/go-sdk), for a Go agent
// that takes its tools over MCP: in process through the SDK's in-memory transports, or over
// any of its transports. A thin layer over the Go turn adapter (memoria/clients/go): each call
// is passed to the adapter as the model produced it (the raw JSON arguments, not validated
// here: the server checks them and words every outcome) and names the adapter's current turn,
// and the result is exactly the server's text, with isError when the call did not do what was
// asked. The backend starts each turn (memory.StartTurn), ends its system prompt with
// memory.PromptSection, and finishes the turn (memory.FinishTurn) after the answer.
package memoriamcp

import (
	"context"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	memoria "memoria/clients/go"
)

// AddTools adds the server's tools, as GetModelTools gave them to memory, to server.
func AddTools(server *mcp.Server, memory *memoria.Adapter) {
	for _, t := range memory.ModelTools().GetTools() {
		name := t.GetName()
		tool := &mcp.Tool{
			Name:        name,
			Description: t.GetDescription(),
			InputSchema: json.RawMessage(t.GetParametersJsonSchema()),
		}
		server.AddTool(tool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			arguments := string(req.Params.Arguments)
			if arguments == "" { // MCP leaves out empty arguments
				arguments = "{}"
			}
			result, err := memory.ExecuteToolCall(ctx, name, arguments)
			if err != nil { // the backend's own mistake (no turn, invalid ids): a protocol error
				return nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: result.Text}}, IsError: result.IsError}, nil
		})
	}
}
