// launch.cpp: (to be written)
