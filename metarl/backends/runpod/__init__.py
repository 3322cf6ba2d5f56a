"""The `runpod` backends: prime-rl inner jobs on Runpod pods, and the hidden eval on the job's pod."""
