"""Records what Kyutai's speech-to-text client `scripts/stt_from_file_rust_server.py` (repository
`kyutai-labs/delayed-streams-modeling`, not part of this project: pass its path) sends on
`/api/asr-streaming`, byte for byte, into `fixtures/interop/stt-from-file-client.json`, by running it
unchanged through a recording proxy in front of a running server (`moshi-native serve --model demo-stt`).
The Rust test `crates/server/tests/asr_replay.rs` replays the recording against the server in CI, where
the script itself is not available.

Needs `msgpack websockets numpy sphn` (the script's dependencies):
    python gen_stt_interop.py SCRIPT --server ws://127.0.0.1:8998 [--input fixtures/stt/1b/input.wav]
The fixture keeps each distinct payload once (`unique`, base64) and the order they were sent in
(`sequence`): the script sends the same second of silence 41 times.
"""
import argparse
import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path

import msgpack
import websockets

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "interop" / "stt-from-file-client.json"


async def main(a):
    sent, received = [], []

    async def handler(client):
        async with websockets.connect(a.server + "/api/asr-streaming", max_size=None) as upstream:
            async def up():
                async for m in client:
                    sent.append(bytes(m))
                    await upstream.send(m)
                await upstream.close()

            async def down():
                try:
                    async for m in upstream:
                        received.append(msgpack.unpackb(m))
                        await client.send(m)
                except websockets.ConnectionClosed:
                    pass

            await asyncio.gather(up(), down())

    async with websockets.serve(handler, "127.0.0.1", 0, max_size=None) as proxy:
        port = proxy.sockets[0].getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, a.script, a.input, "--url", f"ws://127.0.0.1:{port}",
            stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        assert proc.returncode == 0, out
        await asyncio.sleep(1.0)
    unique, sequence = [], []
    for m in sent:
        if m not in unique:
            unique.append(m)
        sequence.append(unique.index(m))
    types = [msgpack.unpackb(m)["type"] for m in sent]
    FIX.write_text(json.dumps({
        "source": "Kyutai delayed-streams-modeling scripts/stt_from_file_rust_server.py "
                  f"(commit {a.commit}), unchanged, fed {Path(a.input).name} at --rtf 1.01, through a "
                  "recording proxy to moshi-native serve --model demo-stt; client-to-server WebSocket "
                  "payloads in the order sent",
        "unique": [base64.b64encode(m).decode() for m in unique],
        "sequence": sequence,
    }) + "\n")
    print(f"{len(sent)} messages ({', '.join(sorted(set(types)))}), {len(unique)} distinct; "
          f"{len(received)} received: {sorted({r['type'] for r in received})}")
    print(out.decode())


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("script")
    p.add_argument("--server", default="ws://127.0.0.1:8998")
    p.add_argument("--input", default=str(Path(__file__).resolve().parents[2] / "fixtures/stt/1b/input.wav"))
    p.add_argument("--commit", default="f6074cb684fcf3c46161f1c3abda3c0805e10d18")
    asyncio.run(main(p.parse_args()))
