#include "coord/runtime_dir.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

using namespace cusnap;

namespace {

/// A fresh CUSNAP_RUNTIME_BASE for one test, removed afterwards.
struct TempBase {
  std::string path;
  TempBase() {
    char t[] = "/tmp/cusnap-rt-XXXXXX";
    REQUIRE(mkdtemp(t));
    path = t;
    setenv("CUSNAP_RUNTIME_BASE", (path + "/base").c_str(), 1);
  }
  ~TempBase() {
    unsetenv("CUSNAP_RUNTIME_BASE");
    (void)!system(("rm -rf " + path).c_str());
  }
};

mode_t mode_of(const std::string& p) {
  struct stat st;
  REQUIRE(lstat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

}  // namespace

TEST_CASE("runtime dir: job names") {
  std::string err;
  CHECK(valid_job_name("train-1.a_b", &err));
  CHECK(!valid_job_name("", &err));
  CHECK(!valid_job_name(".hidden", &err));
  CHECK(!valid_job_name("-x", &err));
  CHECK(!valid_job_name("a/b", &err));
  CHECK(!valid_job_name(std::string(65, 'a'), &err));
  std::string n = default_job_name({"/usr/bin/python3", "x.py"});
  CHECK(n.rfind("python3-", 0) == 0);
  CHECK(n.size() == std::string("python3-").size() + 4);
  CHECK(valid_job_name(n, &err));
  CHECK(valid_job_name(default_job_name({"./--weird name"}), &err));
}

TEST_CASE("runtime dir: the base comes from CUSNAP_RUNTIME_BASE") {
  TempBase b;
  CHECK(runtime_base() == b.path + "/base");
}

TEST_CASE("runtime dir: private directories are created 0700 and checked") {
  TempBase b;
  std::string err;
  std::string d = b.path + "/a/b";
  REQUIRE(ensure_private_dir(d, true, &err));
  CHECK(mode_of(d) == 0700);
  CHECK(mode_of(b.path + "/a") == 0700);
  // A lookup (create unset) checks and changes nothing; creation tightens.
  REQUIRE(chmod(d.c_str(), 01777) == 0);
  CHECK(!ensure_private_dir(d, false, &err));
  CHECK(err.find("its mode is 1777") != std::string::npos);
  CHECK(mode_of(d) == 01777);
  REQUIRE(ensure_private_dir(d, true, &err));
  CHECK(mode_of(d) == 0700);
  REQUIRE(ensure_private_dir(d, false, &err));
  std::string link = b.path + "/link";
  REQUIRE(symlink(d.c_str(), link.c_str()) == 0);
  CHECK(!ensure_private_dir(link, true, &err));
  CHECK(err.find("symbolic link") != std::string::npos);
  CHECK(!ensure_private_dir(b.path + "/missing", false, &err));
  if (geteuid() == 0) {
    std::string other = b.path + "/other";
    REQUIRE(mkdir(other.c_str(), 0700) == 0);
    REQUIRE(chown(other.c_str(), 65534, 65534) == 0);
    CHECK(!ensure_private_dir(other, true, &err));
    CHECK(err.find("owned by uid 65534") != std::string::npos);
  }
}

TEST_CASE("runtime dir: a name is reserved once, found, and released") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  REQUIRE(RuntimeDir::reserve("job1", "", &rd, &err));
  CHECK(rd->path() == b.path + "/base/job1");
  CHECK(mode_of(rd->path()) == 0700);
  CHECK(mode_of(b.path + "/base") == 0700);
  proto::JobStatus s;
  s.name = "job1";
  s.supervisor_pid = getpid();
  s.root_pid = 42;
  s.argv = {"sleep", "1"};
  s.owner_uid = geteuid();
  s.state = "running";
  REQUIRE(rd->write_status(s, &err));
  CHECK(mode_of(rd->job_json_path()) == 0600);

  std::unique_ptr<RuntimeDir> dup;
  bool refused = false;
  CHECK(!RuntimeDir::reserve("job1", "", &dup, &err, &refused));
  CHECK(err.find("already running") != std::string::npos);
  CHECK(refused);
  // The same directory under another name: taken too.
  refused = false;
  CHECK(!RuntimeDir::reserve("job2", rd->path(), &dup, &err, &refused));
  CHECK(err.find("already running in runtime directory") != std::string::npos);
  CHECK(refused);
  // A name cusnap refuses is no directory in use.
  refused = true;
  CHECK(!RuntimeDir::reserve("bad/name", "", &dup, &err, &refused));
  CHECK_FALSE(refused);

  JobEntry e;
  REQUIRE(find_job("job1", &e, &err));
  CHECK(e.status.root_pid == 42);
  CHECK(e.status.argv == std::vector<std::string>{"sleep", "1"});
  REQUIRE(find_job(std::to_string(getpid()), &e, &err));
  REQUIRE(find_job("42", &e, &err));  // the job's root process, ps's PID
  CHECK(e.status.name == "job1");
  CHECK(!find_job("43", &e, &err));
  REQUIRE(find_job(rd->path(), &e, &err));
  JobMiss miss = JobMiss::kAmbiguous;
  CHECK(!find_job("nope", &e, &err, &miss));
  CHECK(miss == JobMiss::kNone);
  CHECK(err.find("no job named 'nope'") != std::string::npos);
  CHECK(list_jobs(true).size() == 1);
  // The runtime directory given as a path, made open to others, or its
  // record damaged: no missing job, an unusable directory (exit 1).
  miss = JobMiss::kNone;
  REQUIRE(chmod(rd->path().c_str(), 0755) == 0);
  CHECK(!find_job(rd->path(), &e, &err, &miss));
  CHECK(miss == JobMiss::kUnusableDir);
  CHECK(err.find("its mode is 0755") != std::string::npos);
  CHECK(err.find("chmod 700") != std::string::npos);
  REQUIRE(chmod(rd->path().c_str(), 0700) == 0);
  const std::string good = [&] {
    std::ifstream in(rd->job_json_path());
    std::stringstream t;
    t << in.rdbuf();
    return t.str();
  }();
  std::ofstream(rd->job_json_path(), std::ios::trunc) << "{\"name\": 3}";
  miss = JobMiss::kNone;
  CHECK(!find_job(rd->path(), &e, &err, &miss));
  CHECK(miss == JobMiss::kUnusableDir);
  CHECK(err.find(rd->path() + "/job.json is malformed") != std::string::npos);
  std::ofstream(rd->job_json_path(), std::ios::trunc) << good;
  miss = JobMiss::kAmbiguous;
  CHECK(!find_job(rd->path() + "/nothing", &e, &err, &miss));
  CHECK(miss == JobMiss::kNone);
  REQUIRE(find_job(rd->path(), &e, &err));

  rd->remove();
  CHECK(access((b.path + "/base/job1").c_str(), F_OK) != 0);
  CHECK(list_jobs(true).empty());
}

TEST_CASE("runtime dir: a job's name is matched before another job's pid") {
  TempBase b;
  std::string err;
  // Job "1" (listed first) has root pid 2, which is job "2"'s name.
  std::unique_ptr<RuntimeDir> one, two;
  REQUIRE(RuntimeDir::reserve("1", "", &one, &err));
  REQUIRE(RuntimeDir::reserve("2", "", &two, &err));
  proto::JobStatus s;
  s.supervisor_pid = getpid();
  s.name = "1";
  s.root_pid = 2;
  REQUIRE(one->write_status(s, &err));
  s.name = "2";
  s.root_pid = 77;
  REQUIRE(two->write_status(s, &err));
  JobEntry e;
  REQUIRE(find_job("2", &e, &err));
  CHECK(e.status.name == "2");
  REQUIRE(find_job("77", &e, &err));
  CHECK(e.status.name == "2");
  // A pid of two jobs (both supervised here) names neither.
  JobMiss miss = JobMiss::kNone;
  CHECK(!find_job(std::to_string(getpid()), &e, &err, &miss));
  CHECK(err.find("more than one job (1, 2)") != std::string::npos);
  CHECK(miss == JobMiss::kAmbiguous);
  one->remove();
  two->remove();
}

TEST_CASE("runtime dir: the directory of a dead supervisor is stale and cleaned") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  REQUIRE(RuntimeDir::reserve("gone", "", &rd, &err));
  proto::JobStatus s;
  s.name = "gone";
  REQUIRE(rd->write_status(s, &err));
  std::string dir = rd->path();
  rd.reset();  // lock released without cleaning up: as if the supervisor died
  CHECK(!runtime_dir_live(dir));
  CHECK(list_jobs(false).empty());
  CHECK(access(dir.c_str(), F_OK) == 0);
  CHECK(list_jobs(true).empty());
  CHECK(access(dir.c_str(), F_OK) != 0);
  // And the name can be taken again.
  REQUIRE(RuntimeDir::reserve("gone", "", &rd, &err));
  rd->remove();
}

TEST_CASE(
    "runtime dir: a base that is there is taken as it is; only runtime directories are cleaned") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  const std::string base = b.path + "/base";
  REQUIRE(mkdir(base.c_str(), 0755) == 0);  // say, CUSNAP_RUNTIME_BASE=. in a project
  bool refused = false;
  CHECK(!RuntimeDir::reserve("j", "", &rd, &err, &refused));
  CHECK(refused);  // a refusal before anything changed (exit 3), not a failure
  CHECK(err.find("its mode is 0755") != std::string::npos);
  CHECK(err.find("point CUSNAP_RUNTIME_BASE at a directory that cusnap alone uses") !=
        std::string::npos);
  CHECK(mode_of(base) == 0755);  // not tightened
  CHECK(access((base + "/j").c_str(), F_OK) != 0);

  // Private, and holding directories of the user's with the names a
  // supervisor uses, but no lock file: nothing in them is touched.
  REQUIRE(chmod(base.c_str(), 0700) == 0);
  const std::string data = base + "/data";
  REQUIRE(mkdir(data.c_str(), 0700) == 0);
  REQUIRE(mkdir((data + "/suspended").c_str(), 0700) == 0);
  for (const char* f : {"/output.log", "/job.json", "/notes.txt", "/suspended/big.bin"})
    REQUIRE(close(creat((data + f).c_str(), 0600)) == 0);
  REQUIRE(mkdir((base + "/empty").c_str(), 0700) == 0);
  // Nor is such a directory taken as a job's own, by the job's name.
  REQUIRE(chmod(data.c_str(), 0755) == 0);
  refused = false;
  CHECK(!RuntimeDir::reserve("data", "", &rd, &err, &refused));
  CHECK(refused);
  CHECK(err.find("it holds") != std::string::npos);
  CHECK(err.find("choose another --name") != std::string::npos);
  CHECK(mode_of(data) == 0755);
  REQUIRE(RuntimeDir::reserve("j", "", &rd, &err));
  rd->remove();
  CHECK(list_jobs(true).empty());
  for (const char* f : {"/output.log", "/job.json", "/notes.txt", "/suspended/big.bin"})
    CHECK_MESSAGE(access((data + f).c_str(), F_OK) == 0, data << f << " was removed");
  CHECK(access((base + "/empty").c_str(), F_OK) == 0);
  // A runtime directory a dead supervisor left (its lock) still goes.
  REQUIRE(RuntimeDir::reserve("dead", "", &rd, &err));
  const std::string dead = rd->path();
  rd.reset();
  CHECK(list_jobs(true).empty());
  CHECK(access(dead.c_str(), F_OK) != 0);
}

TEST_CASE("runtime dir: a suspended job's saved shared memory goes with its directory") {
  TempBase b;
  std::string err;
  for (bool stale : {false, true}) {
    CAPTURE(stale);
    std::unique_ptr<RuntimeDir> rd;
    REQUIRE(RuntimeDir::reserve("susp", "", &rd, &err));
    proto::JobStatus s;
    s.name = "susp";
    REQUIRE(rd->write_status(s, &err));
    const std::string dir = rd->path();
    REQUIRE(mkdir((dir + "/suspended").c_str(), 0700) == 0);
    REQUIRE(mkdir((dir + "/suspended/shared").c_str(), 0700) == 0);
    REQUIRE(close(creat((dir + "/suspended/shared/alloc-1.bin").c_str(), 0600)) == 0);
    // A link inside is removed, not followed.
    const std::string outside = b.path + "/outside";
    REQUIRE(close(creat(outside.c_str(), 0600)) == 0);
    REQUIRE(symlink(outside.c_str(), (dir + "/suspended/shared/link").c_str()) == 0);
    if (stale) {
      rd.reset();  // the supervisor died
      CHECK(list_jobs(true).empty());
    } else {
      rd->remove();
    }
    CHECK(access(dir.c_str(), F_OK) != 0);
    CHECK(access(outside.c_str(), F_OK) == 0);
  }
}

TEST_CASE("runtime dir: a link named suspended is not followed") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  REQUIRE(RuntimeDir::reserve("susp", "", &rd, &err));
  const std::string dir = rd->path(), outside = b.path + "/keep";
  REQUIRE(mkdir(outside.c_str(), 0700) == 0);
  REQUIRE(close(creat((outside + "/file").c_str(), 0600)) == 0);
  REQUIRE(symlink(outside.c_str(), (dir + "/suspended").c_str()) == 0);
  rd->remove();
  CHECK(access((outside + "/file").c_str(), F_OK) == 0);
}

TEST_CASE("runtime dir: a refused base is an error for the job list, a missing one is none") {
  TempBase b;
  std::string err = "x";
  CHECK(list_jobs(false, &err).empty());
  CHECK(err.empty());  // no base yet: no jobs
  const std::string base = b.path + "/base", real = b.path + "/real";
  REQUIRE(mkdir(real.c_str(), 0700) == 0);
  REQUIRE(symlink(real.c_str(), base.c_str()) == 0);
  CHECK(list_jobs(true, &err).empty());
  CHECK(err.find("symbolic link") != std::string::npos);
  JobEntry e;
  JobMiss miss = JobMiss::kNone;
  CHECK(!find_job("x", &e, &err, &miss));  // the reason, not "no job named"
  CHECK(err.find("cannot look for job 'x': refusing runtime base " + base +
                 ": it is a symbolic link") != std::string::npos);
  CHECK(miss == JobMiss::kUnusableBase);
  REQUIRE(unlink(base.c_str()) == 0);
  REQUIRE(close(creat(base.c_str(), 0600)) == 0);
  CHECK(list_jobs(false, &err).empty());
  CHECK(err.find("not a directory") != std::string::npos);
}

TEST_CASE("runtime dir: an explicit directory is found through a link in the base") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  std::string dir = b.path + "/elsewhere";
  REQUIRE(RuntimeDir::reserve("ext", dir, &rd, &err));
  proto::JobStatus s;
  s.name = "ext";
  s.supervisor_pid = getpid();
  REQUIRE(rd->write_status(s, &err));
  JobEntry e;
  REQUIRE(find_job("ext", &e, &err));
  CHECK(e.dir == dir);
  rd->remove();
  struct stat st;
  CHECK(lstat((b.path + "/base/ext").c_str(), &st) != 0);
}

TEST_CASE("runtime dir: an explicit directory holding the user's files is refused, unchanged") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  const std::string dir = b.path + "/mine";
  REQUIRE(mkdir(dir.c_str(), 0755) == 0);
  REQUIRE(close(creat((dir + "/notes.txt").c_str(), 0644)) == 0);
  REQUIRE(close(creat((dir + "/output.log").c_str(), 0644)) == 0);
  bool refused = false;
  CHECK(!RuntimeDir::reserve("mine", dir, &rd, &err, &refused));
  CHECK(refused);
  CHECK(err.find("refusing runtime directory " + dir + ": it holds 'notes.txt'") !=
        std::string::npos);
  // cusnap's names alone, without the lock of a supervisor, are not enough.
  REQUIRE(unlink((dir + "/notes.txt").c_str()) == 0);
  CHECK(!RuntimeDir::reserve("mine", dir, &rd, &err));
  CHECK(err.find("it holds 'output.log'") != std::string::npos);
  CHECK(mode_of(dir) == 0755);
  CHECK(access((dir + "/output.log").c_str(), F_OK) == 0);
  struct stat st;
  CHECK(lstat((b.path + "/base/mine").c_str(), &st) != 0);  // no link either
  // A missing parent is not made.
  refused = false;
  CHECK(!RuntimeDir::reserve("deep", b.path + "/no/such/rd", &rd, &err, &refused));
  CHECK(refused);
  CHECK(err.find("(" + b.path + "/no/such) does not exist") != std::string::npos);
  // A link, or a directory of another user's, is refused as well.
  REQUIRE(symlink(dir.c_str(), (b.path + "/link").c_str()) == 0);
  refused = false;
  CHECK(!RuntimeDir::reserve("ln", b.path + "/link", &rd, &err, &refused));
  CHECK(refused);
  CHECK(err.find("it is a symbolic link") != std::string::npos);
  CHECK(access((b.path + "/no").c_str(), F_OK) != 0);
}

TEST_CASE("runtime dir: an explicit directory may be empty, or one a dead supervisor left") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  const std::string dir = b.path + "/rd";
  REQUIRE(mkdir(dir.c_str(), 0755) == 0);
  REQUIRE(RuntimeDir::reserve("rd", dir, &rd, &err));
  CHECK(mode_of(dir) == 0700);
  proto::JobStatus s;
  s.name = "rd";
  REQUIRE(rd->write_status(s, &err));
  REQUIRE(close(creat((dir + "/output.log").c_str(), 0600)) == 0);
  REQUIRE(mkdir((dir + "/suspended").c_str(), 0700) == 0);
  rd.reset();  // the supervisor died, its files stay
  REQUIRE(RuntimeDir::reserve("rd", dir, &rd, &err));
  CHECK(access((dir + "/job.json").c_str(), F_OK) != 0);  // cleaned for the new job
  rd->remove();
  CHECK(access(dir.c_str(), F_OK) != 0);
}

TEST_CASE("runtime dir: a relative CUSNAP_RUNTIME_BASE is taken from the current directory") {
  TempBase b;
  char old[4096];
  REQUIRE(getcwd(old, sizeof old));
  REQUIRE(chdir(b.path.c_str()) == 0);
  char here[4096];
  REQUIRE(getcwd(here, sizeof here));
  setenv("CUSNAP_RUNTIME_BASE", "rel/./base/", 1);
  CHECK(runtime_base() == std::string(here) + "/rel/base");
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  REQUIRE(RuntimeDir::reserve("relj", "", &rd, &err));
  CHECK(rd->path() == std::string(here) + "/rel/base/relj");
  proto::JobStatus s;
  s.name = "relj";
  s.supervisor_pid = getpid();
  REQUIRE(rd->write_status(s, &err));
  // Found from elsewhere as long as the variable names the same directory.
  REQUIRE(chdir(old) == 0);
  setenv("CUSNAP_RUNTIME_BASE", (std::string(here) + "/rel/base").c_str(), 1);
  JobEntry e;
  REQUIRE(find_job("relj", &e, &err));
  CHECK(e.dir == std::string(here) + "/rel/base/relj");
  rd->remove();
}

TEST_CASE("runtime dir: the default directory given explicitly is taken as it is, without a link") {
  TempBase b;
  std::string err;
  const std::string base = b.path + "/base";
  for (const std::string& dir : {base + "/zz", base + "//zz"}) {
    CAPTURE(dir);
    std::unique_ptr<RuntimeDir> rd;
    REQUIRE(RuntimeDir::reserve("zz", dir, &rd, &err));
    struct stat st;
    REQUIRE(lstat((base + "/zz").c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    proto::JobStatus s;
    s.name = "zz";
    s.supervisor_pid = getpid();
    REQUIRE(rd->write_status(s, &err));
    CHECK(list_jobs(false).size() == 1);
    JobEntry e;
    REQUIRE(find_job("zz", &e, &err));
    rd->remove();
    CHECK(lstat((base + "/zz").c_str(), &st) != 0);
  }
}

TEST_CASE("runtime dir: a reservation that fails leaves nothing it made") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  const std::string base = b.path + "/base";
  REQUIRE(ensure_private_dir(base, true, &err));
  // BASE/NAME is a directory of the user's: the link cannot be made.
  REQUIRE(mkdir((base + "/taken").c_str(), 0700) == 0);
  REQUIRE(close(creat((base + "/taken/notes.txt").c_str(), 0600)) == 0);
  const std::string dir = b.path + "/fresh";
  CHECK(!RuntimeDir::reserve("taken", dir, &rd, &err));
  CHECK(err.find(base + "/taken") != std::string::npos);
  CHECK(access(dir.c_str(), F_OK) != 0);  // made by the reservation, removed
  CHECK(access((base + "/taken/notes.txt").c_str(), F_OK) == 0);
  // An empty directory of the user's stays, without the lock.
  const std::string mine = b.path + "/mine";
  REQUIRE(mkdir(mine.c_str(), 0700) == 0);
  CHECK(!RuntimeDir::reserve("taken", mine, &rd, &err));
  CHECK(access(mine.c_str(), F_OK) == 0);
  CHECK(access((mine + "/lock").c_str(), F_OK) != 0);
}

TEST_CASE("runtime dir: a job whose directory is another entry of the base is listed once") {
  TempBase b;
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  const std::string base = b.path + "/base";
  REQUIRE(RuntimeDir::reserve("aa", base + "/bb", &rd, &err));
  proto::JobStatus s;
  s.name = "aa";
  s.supervisor_pid = getpid();
  REQUIRE(rd->write_status(s, &err));
  std::vector<JobEntry> jobs = list_jobs(true);
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].status.name == "aa");
  CHECK(jobs[0].dir == base + "/bb");
  rd->remove();
  CHECK(list_jobs(true).empty());
  struct stat st;
  CHECK(lstat((base + "/aa").c_str(), &st) != 0);
  CHECK(lstat((base + "/bb").c_str(), &st) != 0);
}

TEST_CASE("runtime dir: a directory that holds no job is said to hold none") {
  TempBase b;
  std::string err;
  const std::string dir = b.path + "/empty";
  REQUIRE(mkdir(dir.c_str(), 0755) == 0);
  JobEntry e;
  CHECK(!find_job(dir, &e, &err));
  CHECK(err.find("no job is running in " + dir) != std::string::npos);
  CHECK(err.find("mode") == std::string::npos);
  CHECK(mode_of(dir) == 0755);
  CHECK(!find_job(b.path + "/missing", &e, &err));
  CHECK(err.find("no job is running in " + b.path + "/missing") != std::string::npos);
}

TEST_CASE("runtime dir: job.json round-trips") {
  proto::JobStatus s, t;
  s.name = "n";
  s.argv = {"a", "b c"};
  s.root_pid = 7;
  s.state = "suspended";
  std::string err;
  REQUIRE(job_status_from_json(job_status_to_json(s), &t, &err));
  CHECK(t.argv == s.argv);
  CHECK(t.state == "suspended");
  CHECK(!job_status_from_json("{", &t, &err));
  CHECK(!job_status_from_json("{\"name\": 3}", &t, &err));
}
