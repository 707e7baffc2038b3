#!/usr/bin/env bash
# One quiet run of issue 14's and issue 11's figures together (2026-12-02 late session; again on 2026-12-03).
set -x
cd "$(dirname "$0")/../../.."
O=${O:-var/s14}   # the results' folder (2026-12-03: O=var/s15)
mkdir -p $O
P="--triton-grpc-port 8101 --triton-http-port 8102 --triton-metrics-port 8103"
waitup() { for i in $(seq 1 300); do curl -sf localhost:8100/health/ready >/dev/null 2>&1 && return 0; curl -sf localhost:8100/health >/dev/null 2>&1 && return 0; sleep 2; done; return 1; }
stop() { kill -INT $SRV; wait $SRV; sleep 3; }
uptime > $O/uptime.log
# voice chat-audio vs sequential in-process
.venv/bin/python -m omni_frontend.serve --pipelines voice --port 8100 $P > $O/serve_voice.log 2>&1 & SRV=$!
waitup
uptime >> $O/uptime.log
scripts/bench --base-url http://127.0.0.1:8100 --workload chat-audio --model voice --voice alloy --num-prompts 8 --num-warmups 1 --max-tokens 64 --max-concurrency 1 --baseline inprocess --result-json $O/voice_chat_audio.json > $O/voice_chat_audio.txt 2>&1
uptime >> $O/uptime.log
.venv/bin/python scripts/profile_ttft.py --base-url http://127.0.0.1:8100 --grpc-url 127.0.0.1:8101 -n 20 > $O/profile_ttft.txt 2>&1
stop
# ASR vs peer
.venv/bin/python -m omni_frontend.serve --pipelines asr,tts --port 8100 $P > $O/serve_asr.log 2>&1 & SRV=$!
scripts/peer_asr_server 8010 > $O/peer.log 2>&1 & PEER=$!
waitup
for i in $(seq 1 120); do curl -sf localhost:8010/health >/dev/null 2>&1 && break; sleep 2; done
curl -s localhost:8100/v1/audio/speech -H 'content-type: application/json' -o $O/clip.wav -d '{"model": "tts", "voice": "alloy", "response_format": "wav", "input": "The train to London leaves at seven in the morning. Please call me back when you get home tonight. Our meeting has been moved to Thursday afternoon, so remember to water the plants before you leave."}'
uptime >> $O/uptime.log
scripts/bench --base-url http://127.0.0.1:8100 --workload transcription --model asr --audio-file $O/clip.wav --num-prompts 8 --num-warmups 1 --max-concurrency 1 4 --baseline-url http://127.0.0.1:8010 --rounds 2 --result-json $O/asr_vs_peer.json > $O/asr_vs_peer.txt 2>&1
uptime >> $O/uptime.log
kill -INT $PEER; pkill -INT -f faster-whisper-server; stop
# realtime end of speech -> first audio
.venv/bin/python -m omni_frontend.serve --pipelines voice,tts,asr --port 8100 $P > $O/serve_rt.log 2>&1 & SRV=$!
waitup
uptime >> $O/uptime.log
scripts/bench --base-url http://127.0.0.1:8100 --workload realtime --num-prompts 6 --num-warmups 1 --max-tokens 64 --barge-ins 0 --vad-sessions 0 --result-json $O/realtime.json > $O/realtime.txt 2>&1
uptime >> $O/uptime.log
stop
echo DONE
