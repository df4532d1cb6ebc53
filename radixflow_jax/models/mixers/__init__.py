"""Token mixers: softmax attention over paged KV, and recurrent mixers over state slots."""
