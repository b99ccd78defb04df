// Uses only installed public headers: build a program, load it, run it.
#include <cstdio>

#include <switchboard/builder.h>
#include <switchboard/switchboard.h>

int main() {
  using namespace switchboard;
  ProgramBuilder b;
  TensorRef x = b.input("x", DType::kF32, {Dim::dynamic(1, 4), 2});
  b.output("y", b.sum(b.mul(x, x), 1));
  auto bytes = b.serialize();
  if (!bytes) return std::fprintf(stderr, "%s\n", bytes.status().to_string().c_str()), 1;
  auto program = Program::from_bytes(*bytes, "consumer");
  if (!program) return std::fprintf(stderr, "%s\n", program.status().to_string().c_str()), 1;
  auto session = Session::create(*program);
  if (!session) return std::fprintf(stderr, "%s\n", session.status().to_string().c_str()), 1;
  auto x_in = Tensor::from_vector<float>(DType::kF32, {2, 2}, {1, 2, 3, 4});
  if (Status st = (*session)->set_input("x", *x_in); !st) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  if (Status st = (*session)->execute(); !st) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  const float* y = (*session)->output("y")->data_as<float>();
  std::printf("switchboard %s on %s: y = [%g, %g]\n", version(), (*session)->device_name().c_str(), y[0], y[1]);
  if (y[0] != 5.f || y[1] != 25.f) return 1;
  std::printf("consumer ok\n");
  return 0;
}
