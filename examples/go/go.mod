// A runnable Go client of Memoria (see main.go). The generated stubs have no public module
// path yet, so they are required through the replace below, from this checkout.
module memoria/examples/go

go 1.26.0

replace memoria/generated/go => ../../generated/go

require (
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
	memoria/generated/go v0.0.0-00010101000000-000000000000
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)
