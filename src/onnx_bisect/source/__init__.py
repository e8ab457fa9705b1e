"""Source stage: load the model and its inputs, export it or open the ONNX file, index the graph."""
