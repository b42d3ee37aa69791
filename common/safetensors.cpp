// safetensors.cpp: (to be written)
