#!/usr/bin/env python3
"""A Python gRPC client, generated from proto/heavykv/v1/generation.proto, against the real server.

Starts `heavykv serve` on a free loopback port, waits for grpc.health.v1 SERVING, streams a greedy
generation and checks it token for token against `heavykv run` on the same prompt, streams a Chat
(rendered with --chat-template) and checks it against Generate of the rendered prompt, then checks
that a bad request gets INVALID_ARGUMENT. Exits non-zero on any failure (run by ctest).
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--stubs", required=True, help="directory with heavykv/v1/*_pb2*.py")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--chat-template", required=True, help="Llama 2's chat template")
    args = ap.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    from heavykv.v1 import generation_pb2 as pb
    from heavykv.v1 import generation_pb2_grpc as pb_grpc

    log = tempfile.NamedTemporaryFile(prefix="heavykv-py-serve-", suffix=".log")
    server = subprocess.Popen(
        [args.binary, "serve", "--model", args.model, "--tokenizer", args.tokenizer,
         "--listen", "127.0.0.1:0", "--metrics-address", "", "--http-address", "",
         "--threads", "1", "--reflection", "--chat-template", args.chat_template],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        port = None
        deadline = time.time() + 30
        while port is None and time.time() < deadline and server.poll() is None:
            m = re.search(rb"gRPC listening on 127\.0\.0\.1:(\d+)", open(log.name, "rb").read())
            port = int(m.group(1)) if m else None
            time.sleep(0.02)
        assert port, "server did not start:\n" + open(log.name).read()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")

        # grpc.health.v1.Health/Check with an empty request; SERVING is field 1 = 1.
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        status = check(b"", timeout=10)
        assert status == b"\x08\x01", f"health: {status!r}"

        # Server reflection (grpc.reflection.v1alpha, on with --reflection): list_services
        # (field 7), then the file that defines heavykv.v1.Generation (file_containing_symbol,
        # field 4).
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        symbol = b"heavykv.v1.Generation"
        replies = list(reflect(iter([b"\x3a\x00", b"\x22" + bytes([len(symbol)]) + symbol]),
                               timeout=10))
        assert len(replies) == 2 and symbol in replies[0], replies
        assert b"grpc.health.v1.Health" in replies[0], replies[0]
        assert b"heavykv/v1/generation.proto" in replies[1], replies[1]

        stub = pb_grpc.GenerationStub(channel)
        prompt = "Once upon a time"
        n = len(stub.Tokenize(pb.TokenizeRequest(text=prompt.encode())).token_ids)
        req = pb.GenerateRequest(prompt=prompt.encode(), max_new_tokens=32,
                                 sampling=pb.SamplingParams(temperature=0))
        ids, text, messages, last = [], "", 0, None
        for msg in stub.Generate(req, timeout=30):
            ids += list(msg.token_ids)
            text += msg.text
            messages += 1
            last = msg
        assert messages > 1, "expected a stream of messages"
        assert last.finish_reason == pb.FINISH_REASON_LENGTH, last
        assert last.usage.completion_tokens == 32, last.usage

        run = json.loads(subprocess.check_output(
            [args.binary, "run", "--model", args.model, "--tokenizer", args.tokenizer,
             "--temperature", "0", "--json", "--prompt", prompt, "--steps", str(n + 31)]))
        assert ids == run["token_ids"][n:], (ids, run["token_ids"])
        assert prompt + text == run["text"], (text, run["text"])

        # Tokenize without special tokens leaves out BOS (id 1).
        plain = stub.Tokenize(pb.TokenizeRequest(text=prompt.encode(), add_special_tokens=False))
        assert [1] + list(plain.token_ids) == list(
            stub.Tokenize(pb.TokenizeRequest(text=prompt.encode())).token_ids), plain

        # Chat: Llama 2's template renders "<s>[INST] {content} [/INST]"; its stream is Generate's
        # for that prompt (BOS added to the text).
        def stream(responses):
            ids, text, last = [], "", None
            for msg in responses:
                ids += list(msg.token_ids)
                text += msg.text
                last = msg
            return ids, text, last.usage.prompt_tokens
        greedy = pb.SamplingParams(temperature=0, seed=7)
        chat = stream(stub.Chat(pb.ChatRequest(
            messages=[pb.ChatMessage(role=b"user", content=prompt.encode())], max_new_tokens=16,
            sampling=greedy), timeout=30))
        gen = stream(stub.Generate(pb.GenerateRequest(
            prompt=f"[INST] {prompt} [/INST]".encode(), max_new_tokens=16, sampling=greedy),
            timeout=30))
        assert chat == gen and chat[0], (chat, gen)
        try:
            list(stub.Chat(pb.ChatRequest(messages=[pb.ChatMessage(role=b"user", content=b"a"),
                                                    pb.ChatMessage(role=b"user", content=b"b")])))
            raise AssertionError("user, user was accepted by Llama 2's template")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert "must alternate" in e.details(), e.details()

        try:
            list(stub.Generate(pb.GenerateRequest(prompt=b"hi", kv=pb.KvParams(policy="lru"))))
            raise AssertionError("an unknown policy was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert "lru" in e.details(), e.details()
        print(f"ok: {len(ids)} tokens in {messages} messages: {text!r}")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
