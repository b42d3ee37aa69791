// checkpoint.cpp: (to be written)
