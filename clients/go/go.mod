// Go client tests: the generated stubs (memoria/generated/go, through the replace below)
// against a running server, and the character-count helper against the shared vectors.
module memoria/clients/go

go 1.26.0

replace memoria/generated/go => ../../generated/go

require (
	golang.org/x/text v0.44.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
	memoria/generated/go v0.0.0-00010101000000-000000000000
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
