// Package greeterpb is the generated Go code of greeter.proto, the demo
// service of examples/grpcserver. It is committed; regenerate it after
// editing greeter.proto with
//
//	go -C examples generate ./grpcserver/...
//
// which needs protoc (apt-get install protobuf-compiler) and the two Go
// plugins on PATH:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
package greeterpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative greeter.proto
