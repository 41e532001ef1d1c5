"""Per-item cost of media input on this CPU: decode (data URI, loopback URL), CLIP 224 preprocessing,
CLAP feature extraction, audio resampling. Run: .venv/bin/python scripts/bench_media.py"""
import os, time, io; os.environ["HF_HUB_OFFLINE"]="1"
import numpy as np
from PIL import Image
from transformers import CLIPImageProcessorPil, ClapFeatureExtractor
from core.media import MediaFetcher, MediaLimits
from benchmarks.media import data_uri, audio_bytes, sine, MediaServer, Route
rng=np.random.default_rng(0)
img=Image.fromarray(rng.integers(0,255,(480,640,3),dtype=np.uint8)); b=io.BytesIO(); img.save(b,"JPEG",quality=90); jpg=b.getvalue()
uri=data_uri(jpg,"image/jpeg"); f=MediaFetcher()
proc=CLIPImageProcessorPil()  # defaults: 224 crop
def t(fn,n=30):
    fn(); s=time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter()-s)/n*1000
print("jpeg bytes", len(jpg))
print("decode 640x480 JPEG data URI: %.2f ms" % t(lambda: f.image(uri, index=0)))
im=f.image(uri,index=0)
print("CLIP 224 preprocessing (PIL processor): %.2f ms" % t(lambda: proc([im], return_tensors="np")))
fe=ClapFeatureExtractor(truncation="rand_trunc")  # 48 kHz, 10 s, 64 mels
wav=audio_bytes(sine(440,10.0,48000),48000)
print("decode 10 s 48k WAV: %.2f ms" % t(lambda: f.audio(data_uri(wav,"audio/wav"), index=0, sampling_rate=48000),10))
w=f.audio(data_uri(wav,"audio/wav"), index=0, sampling_rate=48000)
print("CLAP features 10 s (default extractor): %.2f ms" % t(lambda: fe([w], sampling_rate=48000, return_tensors="np"),10))
w16=audio_bytes(sine(440,10.0,44100),44100)
print("decode+resample 10 s 44.1k->48k: %.2f ms" % t(lambda: f.audio(data_uri(w16,"audio/wav"), index=0, sampling_rate=48000),10))
s=MediaServer(); url=s.add("/a.jpg", Route(jpg,"image/jpeg"))
with s.running():
    lf=MediaFetcher(MediaLimits(allow=("127.0.0.1/32",)))
    print("fetch+decode from loopback URL: %.2f ms" % t(lambda: lf.image(url, index=0)))
