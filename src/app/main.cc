#include <cstdio>

int main() { std::puts("shardtrain: under construction"); return 0; }
