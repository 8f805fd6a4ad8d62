// Generated Go stubs of the memoria.v1 contract (package memoriav1). The .pb.go files are
// made by `make generate` (buf, protoc-gen-go, protoc-gen-go-grpc); this file is not.
//
// The module path is local (no host): the repository has no public Go import path yet, so a
// Go backend uses it with a replace directive, as clients/go does. buf.gen.yaml's
// go_package_prefix must match it.
module memoria/generated/go

go 1.26.0

require (
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)
