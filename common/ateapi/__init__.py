"""Generated gRPC stubs of Agent Substrate's `ateapi` (from proto/ateapi.proto, by proto/generate.sh).

Only common/substrate.py (client) and local_substrate/ (server) import these; nothing else sees
protobuf or gRPC types.
"""
