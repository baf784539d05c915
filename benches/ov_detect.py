#!/usr/bin/env python3
"""Detection with OpenVINO the way a Python user writes it: the peer of scripts/bench-detect.

cv2.VideoCapture decodes; cv2.dnn.blobFromImage resizes, swaps R and B and scales; an
AsyncInferQueue (OpenVINO's own count of requests) runs the network compiled with the
THROUGHPUT hint; each finished request's callback decodes the boxes of the wanted classes with
numpy, NMSBoxes per class, and writes one JSON line. No video is written.

    ov_detect.py VIDEO MODEL.onnx LAYOUT SIZE PRECISION OUT.jsonl VIDEO_OUT FRAMES
    SIZE: the square input's side, or WIDTHxHEIGHT (an input of the frame's shape)
    LAYOUT: darknet (yolov3-tiny.onnx: rows of cx cy w h (0..1) obj scores) or
            yolov8 ([1, 4 + classes, candidates], input pixels)
    PRECISION: the INFERENCE_PRECISION_HINT, bf16 or f32
    VIDEO_OUT: - for none, or a path: the boxes drawn on each frame (cv2.rectangle, putText)
               and the frames written in order with cv2.VideoWriter (mp4v)
The demo's class, person, is the one kept.
"""
import json
import sys
import threading

import cv2
import numpy as np
import openvino as ov

video, model, layout, size, precision, out_path, video_out, frames = sys.argv[1:9]
width, height = map(int, size.split("x")) if "x" in size else (int(size), int(size))
frames = int(frames)
names = open("models/coco.names").read().splitlines()
wanted = [names.index("person")]
core = ov.Core()
net = core.read_model(model)
net.reshape([1, 3, height, width])
compiled = core.compile_model(net, "CPU", {
    "PERFORMANCE_HINT": "THROUGHPUT",
    "INFERENCE_PRECISION_HINT": precision,
})
queue = ov.AsyncInferQueue(compiled)
out = open(out_path, "w")
# VIDEO_OUT: frames drawn, waiting for the earlier ones (requests finish out of order)
writer, drawn, next_frame, lock = None, {}, 0, threading.Lock()


def write_in_order(index, image):
    global next_frame
    with lock:
        drawn[index] = image
        while next_frame in drawn:
            writer.write(drawn.pop(next_frame))
            next_frame += 1


def done(request, userdata):
    index, image = userdata
    h, w = image.shape[:2]
    if layout == "yolov8":
        rows = request.get_output_tensor(0).data[0].T  # candidates x (4 + classes)
        xywh, scores = rows[:, :4] * [w / width, h / height, w / width, h / height], rows[:, 4:]
    else:
        rows = np.concatenate([t.data.reshape(-1, 85) for t in request.output_tensors])
        xywh, scores = rows[:, :4] * [w, h, w, h], rows[:, 5:]
    found = []
    for c in wanted:
        keep = scores[:, c] >= 0.4
        if not keep.any():
            continue
        b, s = xywh[keep], scores[keep, c]
        boxes = np.column_stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 2], b[:, 3]])
        for i in cv2.dnn.NMSBoxes(boxes.round().astype(int).tolist(), s.tolist(), 0.4, 0.45):
            x, y, bw, bh = boxes[i].tolist()
            found.append({"class": names[c], "score": float(s[i]), "bbox": {"x": x, "y": y, "width": bw, "height": bh}})
    out.write(json.dumps({"frame": index, "detections": found}) + "\n")
    if writer is not None:
        for d in found:
            b = d["bbox"]
            x, y = int(b["x"]), int(b["y"])
            cv2.rectangle(image, (x, y), (x + int(b["width"]), y + int(b["height"])), (0, 255, 0), 2)
            cv2.putText(image, f"{d['class']} {d['score']:.2f}", (x, max(y - 4, 12)),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 255, 0), 1)
        write_in_order(index, image)


queue.set_callback(done)
cap = cv2.VideoCapture(video)
for index in range(frames):
    ok, frame = cap.read()
    if not ok:
        break
    if video_out != "-" and writer is None:
        h, w = frame.shape[:2]
        writer = cv2.VideoWriter(video_out, cv2.VideoWriter_fourcc(*"mp4v"), 10, (w, h))
    blob = cv2.dnn.blobFromImage(frame, 1 / 255, (width, height), swapRB=True)
    queue.start_async({0: blob}, (index, frame))
queue.wait_all()
out.close()
if writer is not None:
    writer.release()
